package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"go.yaml.in/yaml/v3"
)

// Helm's media types for a chart stored as an OCI artifact (what `helm
// push` writes and `helm pull oci://` reads).
const (
	helmConfigType = types.MediaType("application/vnd.cncf.helm.config.v1+json")
	helmChartType  = types.MediaType("application/vnd.cncf.helm.chart.content.v1.tar+gzip")
)

// maxChart bounds a packaged chart: gpud's is a few tens of KiB.
const maxChart = 16 << 20

// chartMetadata reads NAME/Chart.yaml from a packaged chart (`helm
// package`'s .tgz) and returns its name, version and the metadata as the
// JSON Helm stores as the artifact's config.
func chartMetadata(tgz []byte) (chartName, version string, config []byte, err error) {
	zr, err := gzip.NewReader(bytes.NewReader(tgz))
	if err != nil {
		return "", "", nil, fmt.Errorf("not a packaged chart: %w", err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return "", "", nil, errors.New("not a packaged chart: no <name>/Chart.yaml")
		}
		if err != nil {
			return "", "", nil, fmt.Errorf("not a packaged chart: %w", err)
		}
		if path.Base(h.Name) != "Chart.yaml" || strings.Count(path.Clean(h.Name), "/") != 1 {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(tr, 1<<20))
		if err != nil {
			return "", "", nil, fmt.Errorf("%s: %w", h.Name, err)
		}
		var meta map[string]any
		if err := yaml.Unmarshal(b, &meta); err != nil {
			return "", "", nil, fmt.Errorf("%s: %w", h.Name, err)
		}
		n, _ := meta["name"].(string)
		v, _ := meta["version"].(string)
		if n == "" || v == "" {
			return "", "", nil, fmt.Errorf("%s: no name or version", h.Name)
		}
		config, err := json.Marshal(meta)
		if err != nil {
			return "", "", nil, fmt.Errorf("%s: %w", h.Name, err)
		}
		return n, v, config, nil
	}
}

// rawManifest is a manifest already serialized, for remote.Put.
type rawManifest struct {
	b  []byte
	mt types.MediaType
}

func (m rawManifest) RawManifest() ([]byte, error)        { return m.b, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return m.mt, nil }

// pushChart sends a packaged chart to repo as Helm's OCI artifact,
// repo/NAME:VERSION (a '+' of the version as '_', Helm's rule): `helm
// install NAME oci://repo/NAME --version VERSION` installs it.
func pushChart(ctx context.Context, archive, repo string, opts ...remote.Option) (string, v1.Hash, error) {
	f, err := os.Open(archive)
	if err != nil {
		return "", v1.Hash{}, fmt.Errorf("push-chart: %w", err)
	}
	tgz, err := io.ReadAll(io.LimitReader(f, maxChart+1))
	f.Close()
	if err != nil {
		return "", v1.Hash{}, fmt.Errorf("push-chart: %s: %w", archive, err)
	}
	if len(tgz) > maxChart {
		return "", v1.Hash{}, fmt.Errorf("push-chart: %s: larger than %d bytes", archive, maxChart)
	}
	chartName, version, config, err := chartMetadata(tgz)
	if err != nil {
		return "", v1.Hash{}, fmt.Errorf("push-chart: %s: %w", archive, err)
	}
	ref := strings.TrimSuffix(repo, "/") + "/" + chartName + ":" + strings.ReplaceAll(version, "+", "_")
	r, err := name.ParseReference(ref, name.StrictValidation)
	if err != nil {
		return "", v1.Hash{}, fmt.Errorf("push-chart: %q: %w", ref, err)
	}
	opts = append(opts, remote.WithContext(ctx))
	cfg, content := static.NewLayer(config, helmConfigType), static.NewLayer(tgz, helmChartType)
	descs := make([]v1.Descriptor, 2)
	for i, l := range []v1.Layer{cfg, content} {
		if err := remote.WriteLayer(r.Context(), l, opts...); err != nil {
			return "", v1.Hash{}, fmt.Errorf("push-chart: %s: %w", ref, err)
		}
		d, _ := l.Digest()
		size, _ := l.Size()
		mt, _ := l.MediaType()
		descs[i] = v1.Descriptor{MediaType: mt, Size: size, Digest: d}
	}
	descs[1].Annotations = map[string]string{"org.opencontainers.image.title": path.Base(archive)}
	m, err := json.Marshal(v1.Manifest{SchemaVersion: 2, MediaType: types.OCIManifestSchema1, Config: descs[0], Layers: descs[1:]})
	if err != nil {
		return "", v1.Hash{}, fmt.Errorf("push-chart: %w", err)
	}
	if err := remote.Put(r, rawManifest{m, types.OCIManifestSchema1}, opts...); err != nil {
		return "", v1.Hash{}, fmt.Errorf("push-chart: %s: %w", ref, err)
	}
	d, _, err := v1.SHA256(bytes.NewReader(m))
	return ref, d, err
}
