// Command ociimage builds gpud's release image from root filesystems made
// on this machine (one per platform) and pushes it: no Docker engine, no
// base image, nothing pulled.
//
//	ociimage build --name REF --out ARCHIVE --epoch SECONDS \
//	    --platform linux/amd64=DIR [--platform linux/arm64=DIR] \
//	    [--entrypoint /gpud] [--cmd run] [--label k=v]... [--docker-archive FILE]
//	ociimage push ARCHIVE REF
//	ociimage push-chart CHART.tgz REPOSITORY
//	ociimage inspect ARCHIVE
//
// ARCHIVE is an OCI image layout in a tar: its index.json names one
// multi-platform image index (annotated with REF, as `ctr images import`
// and `skopeo copy oci-archive:` read it). The same inputs give the same
// bytes (entries sorted, owners 0, every time the --epoch), so a rebuild
// of a release tag can be checked digest for digest. --docker-archive
// also writes the one platform that matches this machine as a
// `docker load` tarball, for Docker engines that cannot load OCI layouts.
// push sends the index and every platform's image to a registry, with
// the credentials `docker login` (or a Docker config.json) left.
// push-chart sends a packaged Helm chart (`helm package`'s .tgz) as Helm's
// OCI artifact to REPOSITORY/NAME:VERSION, with the same credentials:
// `helm install gpud oci://REPOSITORY/gpud --version VERSION` installs it.
//
// The image assembly and the registry protocol are
// github.com/google/go-containerregistry's.
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotations on index.json's entry that name the image for importers.
const (
	annotContainerdName = "io.containerd.image.name"
	annotRefName        = "org.opencontainers.image.ref.name"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: ociimage build|push|push-chart|inspect ARGS")
	}
	switch args[0] {
	case "build":
		spec, err := parseBuild(args[1:])
		if err != nil {
			return err
		}
		digest, err := build(spec)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%s %s %s\n", spec.out, spec.name, digest)
		return nil
	case "push":
		if len(args) != 3 {
			return errors.New("usage: ociimage push ARCHIVE REF")
		}
		digest, err := push(ctx, args[1], args[2], remote.WithAuthFromKeychain(authn.DefaultKeychain))
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%s@%s\n", args[2], digest)
		return nil
	case "push-chart":
		if len(args) != 3 {
			return errors.New("usage: ociimage push-chart CHART.tgz REPOSITORY")
		}
		ref, digest, err := pushChart(ctx, args[1], args[2], remote.WithAuthFromKeychain(authn.DefaultKeychain))
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%s@%s\n", ref, digest)
		return nil
	case "inspect":
		if len(args) != 2 {
			return errors.New("usage: ociimage inspect ARCHIVE")
		}
		return inspect(args[1], out)
	}
	return fmt.Errorf("unknown command %q (build, push, push-chart, inspect)", args[0])
}

// buildSpec is what `ociimage build` was asked for.
type buildSpec struct {
	name          string
	out           string
	dockerArchive string
	epoch         time.Time
	platforms     []platformRoot
	entrypoint    []string
	cmd           []string
	labels        map[string]string
}

// platformRoot is one platform's root filesystem directory.
type platformRoot struct {
	platform v1.Platform
	dir      string
}

func parseBuild(args []string) (buildSpec, error) {
	s := buildSpec{labels: map[string]string{}}
	epochSet := false
	for i := 0; i < len(args); i++ {
		key := args[i]
		if !strings.HasPrefix(key, "--") {
			return s, fmt.Errorf("build: unexpected argument %q", key)
		}
		if i+1 >= len(args) {
			return s, fmt.Errorf("build: %s needs a value", key)
		}
		val := args[i+1]
		i++
		switch key {
		case "--name":
			s.name = val
		case "--out":
			s.out = val
		case "--docker-archive":
			s.dockerArchive = val
		case "--epoch":
			sec, err := strconv.ParseInt(val, 10, 64)
			if err != nil || sec < 0 {
				return s, fmt.Errorf("build: --epoch %q: want seconds since 1970", val)
			}
			s.epoch, epochSet = time.Unix(sec, 0).UTC(), true
		case "--platform":
			p, dir, ok := strings.Cut(val, "=")
			if !ok || dir == "" {
				return s, fmt.Errorf("build: --platform %q: want os/arch[/variant]=DIR", val)
			}
			plat, err := v1.ParsePlatform(p)
			if err != nil || plat.OS == "" || plat.Architecture == "" {
				return s, fmt.Errorf("build: --platform %q: want os/arch[/variant]=DIR", val)
			}
			for _, have := range s.platforms {
				if have.platform.Equals(*plat) {
					return s, fmt.Errorf("build: --platform %s given twice", p)
				}
			}
			s.platforms = append(s.platforms, platformRoot{platform: *plat, dir: dir})
		case "--entrypoint":
			s.entrypoint = append(s.entrypoint, val)
		case "--cmd":
			s.cmd = append(s.cmd, val)
		case "--label":
			k, v, ok := strings.Cut(val, "=")
			if !ok || k == "" {
				return s, fmt.Errorf("build: --label %q: want KEY=VALUE", val)
			}
			s.labels[k] = v
		default:
			return s, fmt.Errorf("build: unknown flag %s", key)
		}
	}
	switch {
	case s.name == "":
		return s, errors.New("build: --name is required")
	case s.out == "":
		return s, errors.New("build: --out is required")
	case !epochSet:
		return s, errors.New("build: --epoch is required (e.g. the release commit's time)")
	case len(s.platforms) == 0:
		return s, errors.New("build: at least one --platform os/arch=DIR")
	}
	if _, err := name.ParseReference(s.name, name.StrictValidation); err != nil {
		return s, fmt.Errorf("build: --name %q: %w", s.name, err)
	}
	return s, nil
}

// build writes the archive (and the docker archive when asked) and
// returns the image index's digest.
func build(s buildSpec) (v1.Hash, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	var native v1.Image
	for _, pr := range s.platforms {
		img, err := platformImage(s, pr)
		if err != nil {
			return v1.Hash{}, err
		}
		plat := pr.platform
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &plat}})
		if plat.OS == "linux" && plat.Architecture == runtime.GOARCH {
			native = img
		}
	}
	digest, err := idx.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("build: index digest: %w", err)
	}
	if err := writeArchive(s.out, s.name, idx, s.epoch); err != nil {
		return v1.Hash{}, err
	}
	if s.dockerArchive != "" {
		if native == nil {
			return v1.Hash{}, fmt.Errorf("build: --docker-archive: no linux/%s platform given", runtime.GOARCH)
		}
		tag, err := name.NewTag(s.name, name.StrictValidation)
		if err != nil {
			return v1.Hash{}, fmt.Errorf("build: --docker-archive needs a tagged --name: %w", err)
		}
		if err := tarball.WriteToFile(s.dockerArchive, tag, native); err != nil {
			return v1.Hash{}, fmt.Errorf("build: docker archive %s: %w", s.dockerArchive, err)
		}
	}
	return digest, nil
}

// platformImage is one platform's image: one layer (the root filesystem)
// and a config with the entrypoint, labels and the epoch as its times.
func platformImage(s buildSpec, pr platformRoot) (v1.Image, error) {
	layerTar, err := dirTar(pr.dir, s.epoch, false)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("build: %s layer: %w", pr.platform, err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: v1.Time{Time: s.epoch}, CreatedBy: "ociimage build", Comment: "gpud and the C library it links"},
	})
	if err != nil {
		return nil, fmt.Errorf("build: %s: %w", pr.platform, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("build: %s config: %w", pr.platform, err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant, cf.OSVersion = pr.platform.OS, pr.platform.Architecture, pr.platform.Variant, pr.platform.OSVersion
	cf.Created = v1.Time{Time: s.epoch}
	cf.Config.Entrypoint = s.entrypoint
	cf.Config.Cmd = s.cmd
	cf.Config.Labels = s.labels
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("build: %s config: %w", pr.platform, err)
	}
	return img, nil
}

// dirTar is the directory's tree as a tar: entries in lexical order,
// owned by 0:0, every time the epoch; regular files, directories and
// symbolic links only (a device node or socket in a root filesystem
// made for an image is a mistake). With plainModes every file is 0644 and
// every directory 0755 (an image layout, whose writer's modes vary).
func dirTar(dir string, epoch time.Time, plainModes bool) ([]byte, error) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), Mode: tarMode(info.Mode()), ModTime: epoch, Format: tar.FormatPAX}
		if plainModes {
			h.Mode = 0o644
			if d.IsDir() {
				h.Mode = 0o755
			}
		}
		switch {
		case d.IsDir():
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			h.Typeflag, h.Linkname = tar.TypeSymlink, target
		case d.Type().IsRegular():
			h.Typeflag, h.Size = tar.TypeReg, info.Size()
		default:
			return fmt.Errorf("%s: not a regular file, directory or symbolic link", path)
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := io.Copy(tw, f); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("build: root filesystem %s: %w", dir, err)
	}
	return b.Bytes(), nil
}

// tarMode is a file mode as tar's header holds it: permissions plus
// setuid, setgid and sticky bits.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

// writeArchive writes the index as an OCI layout whose index.json names it
// (ref), tarred in a fixed order with fixed owners and times, through a
// temporary file renamed into place.
func writeArchive(out, ref string, idx v1.ImageIndex, epoch time.Time) error {
	tmp, err := os.MkdirTemp("", "ociimage-layout-")
	if err != nil {
		return fmt.Errorf("build: %w", err)
	}
	defer os.RemoveAll(tmp)
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return fmt.Errorf("build: layout: %w", err)
	}
	tag := ref
	if t, err := name.NewTag(ref, name.StrictValidation); err == nil {
		tag = t.TagStr()
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{annotContainerdName: ref, annotRefName: tag})); err != nil {
		return fmt.Errorf("build: layout: %w", err)
	}
	layoutTar, err := dirTar(tmp, epoch, true)
	if err != nil {
		return err
	}
	part := out + ".part"
	if err := os.WriteFile(part, layoutTar, 0o644); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	if err := os.Rename(part, out); err != nil {
		os.Remove(part)
		return fmt.Errorf("build: %w", err)
	}
	return nil
}

// readArchive unpacks an archive into a temporary directory (removed by
// the returned function) and returns the image index its index.json names.
func readArchive(archive string) (v1.ImageIndex, map[string]string, func(), error) {
	tmp, err := os.MkdirTemp("", "ociimage-read-")
	if err != nil {
		return nil, nil, nil, err
	}
	done := func() { os.RemoveAll(tmp) }
	fail := func(err error) (v1.ImageIndex, map[string]string, func(), error) {
		done()
		return nil, nil, nil, fmt.Errorf("%s: %w", archive, err)
	}
	if err := untar(archive, tmp); err != nil {
		return fail(err)
	}
	top, err := layout.ImageIndexFromPath(tmp)
	if err != nil {
		return fail(err)
	}
	m, err := top.IndexManifest()
	if err != nil {
		return fail(err)
	}
	if len(m.Manifests) != 1 || !m.Manifests[0].MediaType.IsIndex() {
		return fail(errors.New("index.json must name exactly one image index (an ociimage build archive)"))
	}
	idx, err := top.ImageIndex(m.Manifests[0].Digest)
	if err != nil {
		return fail(err)
	}
	return idx, m.Manifests[0].Annotations, done, nil
}

// untar unpacks regular files and directories only, and refuses names
// that would leave dir.
func untar(archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		clean := filepath.Clean(h.Name)
		if !filepath.IsLocal(clean) {
			return fmt.Errorf("entry %q leaves the archive", h.Name)
		}
		target := filepath.Join(dir, clean)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			w, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
			if err != nil {
				return err
			}
			_, err = io.Copy(w, tr)
			if cerr := w.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("entry %q: only files and directories belong in an image layout", h.Name)
		}
	}
}

// push sends the archive's index, with every platform's image, to ref.
func push(ctx context.Context, archive, ref string, opts ...remote.Option) (v1.Hash, error) {
	r, err := name.ParseReference(ref, name.StrictValidation)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("push: %q: %w", ref, err)
	}
	idx, _, done, err := readArchive(archive)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("push: %w", err)
	}
	defer done()
	if err := remote.WriteIndex(r, idx, append(opts, remote.WithContext(ctx))...); err != nil {
		return v1.Hash{}, fmt.Errorf("push: %s: %w", ref, err)
	}
	return idx.Digest()
}

// inspect prints the archive's name, index digest and, per platform, the
// manifest digest and the entrypoint.
func inspect(archive string, out io.Writer) error {
	idx, annot, done, err := readArchive(archive)
	if err != nil {
		return err
	}
	defer done()
	d, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%s %s\n", annot[annotContainerdName], d)
	m, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	var lines []string
	for _, desc := range m.Manifests {
		img, err := idx.Image(desc.Digest)
		if err != nil {
			return err
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return err
		}
		lines = append(lines, fmt.Sprintf("  %s %s entrypoint=%q cmd=%q version=%s",
			desc.Platform, desc.Digest, cf.Config.Entrypoint, cf.Config.Cmd, cf.Config.Labels["org.opencontainers.image.version"]))
	}
	slices.Sort(lines)
	for _, l := range lines {
		fmt.Fprintln(out, l)
	}
	return nil
}
