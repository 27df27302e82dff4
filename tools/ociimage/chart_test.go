package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gpud/gpud/internal/testutil"
)

// packagedChart packages gpud's chart with the pinned helm, stamped
// version 1.2.3+build.4 (testutil.Helm: skips when helm is not built, builds it under CI).
func packagedChart(t *testing.T) (helm, tgz string) {
	t.Helper()
	helm = testutil.Helm(t)
	dir := t.TempDir()
	if out, err := exec.Command("cp", "-r", "../../deploy/helm/gpud", dir).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	cmd := exec.Command(helm, "package", filepath.Join(dir, "gpud"), "--version", "1.2.3+build.4", "--app-version", "v1.2.3", "-d", dir)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+dir, "HELM_CONFIG_HOME="+dir, "HELM_DATA_HOME="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("helm package: %v %s", err, out)
	}
	return helm, filepath.Join(dir, "gpud-1.2.3+build.4.tgz")
}

// push-chart stores a packaged chart as Helm's OCI artifact: the
// registry has it under NAME:VERSION ('+' as '_') with Helm's media types,
// and `helm pull oci://` gets back the same bytes.
func TestPushChartToRegistry(t *testing.T) {
	helm, tgz := packagedChart(t)
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	var out bytes.Buffer
	if err := run(context.Background(), []string{"push-chart", tgz, u.Host + "/team/charts"}, &out); err != nil {
		t.Fatal(err)
	}
	ref := u.Host + "/team/charts/gpud:1.2.3_build.4"
	if !strings.HasPrefix(out.String(), ref+"@sha256:") {
		t.Errorf("push-chart printed %q, want %s@sha256:...", out.String(), ref)
	}
	r, _ := name.ParseReference(ref)
	img, err := remote.Image(r)
	if err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.Config.MediaType != helmConfigType || len(m.Layers) != 1 || m.Layers[0].MediaType != helmChartType {
		t.Errorf("manifest %+v: want Helm's config and one chart layer", m)
	}
	raw, _ := img.RawConfigFile()
	var meta map[string]any
	if err := json.Unmarshal(raw, &meta); err != nil || meta["name"] != "gpud" || meta["version"] != "1.2.3+build.4" || meta["appVersion"] != "v1.2.3" {
		t.Errorf("config %s (%v): want the chart's metadata", raw, err)
	}
	want, _ := os.ReadFile(tgz)
	l, _ := img.LayerByDigest(m.Layers[0].Digest)
	rc, _ := l.Compressed()
	got, _ := io.ReadAll(rc)
	if !bytes.Equal(got, want) {
		t.Errorf("the registry's chart differs from the package (%d bytes, %d)", len(got), len(want))
	}

	// Helm itself installs from it.
	dir := t.TempDir()
	cmd := exec.Command(helm, "pull", "oci://"+u.Host+"/team/charts/gpud", "--version", "1.2.3+build.4", "--plain-http", "-d", dir)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+dir, "HELM_CONFIG_HOME="+dir, "HELM_DATA_HOME="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("helm pull: %v\n%s", err, out)
	}
	if pulled, _ := os.ReadFile(filepath.Join(dir, "gpud-1.2.3+build.4.tgz")); !bytes.Equal(pulled, want) {
		t.Errorf("helm pull got %d bytes, pushed %d", len(pulled), len(want))
	}

	// Not a chart: a clear error, nothing sent.
	notChart := filepath.Join(t.TempDir(), "x.tgz")
	os.WriteFile(notChart, []byte("not gzip"), 0o644)
	if err := run(context.Background(), []string{"push-chart", notChart, u.Host + "/c"}, &out); err == nil || !strings.Contains(err.Error(), "not a packaged chart") {
		t.Errorf("a file that is no chart: %v", err)
	}
}
