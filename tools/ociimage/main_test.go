package main

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"log"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// rootfs makes a small root filesystem like the release's: the binary,
// a library, a symbolic link, a sticky /tmp.
func rootfs(t *testing.T, arch string) string {
	t.Helper()
	d := t.TempDir()
	for _, dir := range []string{"etc", "lib", "tmp", "var/lib/gpud"} {
		if err := os.MkdirAll(filepath.Join(d, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(d, "tmp"), 0o777|os.ModeSticky)
	os.WriteFile(filepath.Join(d, "gpud"), []byte("binary for "+arch), 0o755)
	os.WriteFile(filepath.Join(d, "lib", "libc.so.6"), []byte("libc for "+arch), 0o644)
	os.Symlink("libc.so.6", filepath.Join(d, "lib", "libc.so"))
	os.WriteFile(filepath.Join(d, "etc", "passwd"), []byte("root:x:0:0:root:/:/gpud\n"), 0o644)
	return d
}

func buildArgs(out string, amd, arm string, more ...string) []string {
	return append([]string{"build", "--name", "registry.example/gpud:v1.2.3", "--out", out, "--epoch", "1700000000",
		"--platform", "linux/amd64=" + amd, "--platform", "linux/arm64=" + arm,
		"--entrypoint", "/gpud", "--cmd", "run", "--label", "org.opencontainers.image.version=v1.2.3"}, more...)
}

// The same inputs give the same archive, byte for byte, whatever the
// files' own times; both platforms are in the index with the entrypoint.
func TestBuildIsReproducible(t *testing.T) {
	amd, arm := rootfs(t, "amd64"), rootfs(t, "arm64")
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.tar"), filepath.Join(dir, "b.tar")
	var out bytes.Buffer
	if err := run(context.Background(), buildArgs(a, amd, arm), &out); err != nil {
		t.Fatal(err)
	}
	// Touch every file: a rebuild on another day.
	filepath.Walk(amd, func(p string, _ os.FileInfo, _ error) error {
		return syscall.Utime(p, &syscall.Utimbuf{Actime: 1, Modtime: 1})
	})
	if err := run(context.Background(), buildArgs(b, amd, arm), &out); err != nil {
		t.Fatal(err)
	}
	ab, _ := os.ReadFile(a)
	bb, _ := os.ReadFile(b)
	if len(ab) == 0 || !bytes.Equal(ab, bb) {
		t.Fatalf("two builds of the same inputs differ (%d and %d bytes)", len(ab), len(bb))
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || strings.Fields(lines[0])[2] != strings.Fields(lines[1])[2] || !strings.Contains(lines[0], "sha256:") {
		t.Errorf("build output: %q", lines)
	}

	// A changed file changes the digest.
	os.WriteFile(filepath.Join(arm, "gpud"), []byte("another binary"), 0o755)
	c := filepath.Join(dir, "c.tar")
	var out2 bytes.Buffer
	if err := run(context.Background(), buildArgs(c, amd, arm), &out2); err != nil {
		t.Fatal(err)
	}
	if strings.Fields(out2.String())[2] == strings.Fields(lines[0])[2] {
		t.Error("a changed binary kept the index digest")
	}

	var insp bytes.Buffer
	if err := run(context.Background(), []string{"inspect", a}, &insp); err != nil {
		t.Fatal(err)
	}
	s := insp.String()
	for _, want := range []string{"registry.example/gpud:v1.2.3 sha256:", "linux/amd64 sha256:", "linux/arm64 sha256:",
		`entrypoint=["/gpud"] cmd=["run"] version=v1.2.3`} {
		if !strings.Contains(s, want) {
			t.Errorf("inspect lacks %q:\n%s", want, s)
		}
	}
}

// The layer holds the tree as made: modes (sticky /tmp, executable
// binary), the symbolic link, owner 0 and the epoch on every entry.
func TestLayerContents(t *testing.T) {
	amd := rootfs(t, "amd64")
	s := buildSpec{name: "x/gpud:1", epoch: time.Unix(1700000000, 0).UTC(), platforms: []platformRoot{{v1.Platform{OS: "linux", Architecture: "amd64"}, amd}}}
	img, err := platformImage(s, s.platforms[0])
	if err != nil {
		t.Fatal(err)
	}
	layers, _ := img.Layers()
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	seen := map[string]*tar.Header{}
	tr := tar.NewReader(rc)
	var names []string
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		seen[h.Name] = h
		names = append(names, h.Name)
		if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(s.epoch) {
			t.Errorf("%s: owner %d:%d time %v", h.Name, h.Uid, h.Gid, h.ModTime)
		}
	}
	want := []string{"etc/", "etc/passwd", "gpud", "lib/", "lib/libc.so", "lib/libc.so.6", "tmp/", "var/", "var/lib/", "var/lib/gpud/"}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Errorf("entries %q, want %q", names, want)
	}
	if h := seen["tmp/"]; h == nil || h.Mode != 0o1777 {
		t.Errorf("tmp/: %+v, want mode 1777", h)
	}
	if h := seen["gpud"]; h == nil || h.Mode != 0o755 {
		t.Errorf("gpud: %+v, want mode 755", h)
	}
	if h := seen["lib/libc.so"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "libc.so.6" {
		t.Errorf("lib/libc.so: %+v, want a link to libc.so.6", h)
	}
}

// push sends the index and both platforms' images to a registry (an
// in-process one, go-containerregistry's): what comes back is what was
// built, digest for digest, and each platform resolves to its own image.
func TestPushToRegistry(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	amd, arm := rootfs(t, "amd64"), rootfs(t, "arm64")
	archive := filepath.Join(t.TempDir(), "gpud.tar")
	var out bytes.Buffer
	if err := run(context.Background(), buildArgs(archive, amd, arm), &out); err != nil {
		t.Fatal(err)
	}
	built := strings.Fields(out.String())[2]
	ref := u.Host + "/platform/gpud:v1.2.3"
	out.Reset()
	digest, err := push(context.Background(), archive, ref)
	if err != nil {
		t.Fatal(err)
	}
	if digest.String() != built {
		t.Errorf("pushed %s, built %s", digest, built)
	}
	r, _ := name.ParseReference(ref)
	idx, err := remote.Index(r)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := idx.Digest(); d.String() != built {
		t.Errorf("the registry has %s, built %s", d, built)
	}
	for _, arch := range []string{"amd64", "arm64"} {
		img, err := remote.Image(r, remote.WithPlatform(v1.Platform{OS: "linux", Architecture: arch}))
		if err != nil {
			t.Fatalf("%s: %v", arch, err)
		}
		cf, err := img.ConfigFile()
		if err != nil || cf.Architecture != arch || cf.Config.Entrypoint[0] != "/gpud" {
			t.Errorf("%s: config %+v, %v", arch, cf, err)
		}
	}
	// Not a registry reference: a clear error, nothing sent.
	if _, err := push(context.Background(), archive, "Not A Ref"); err == nil || !strings.Contains(err.Error(), "Not A Ref") {
		t.Errorf("bad reference: %v", err)
	}
}

// --docker-archive writes this machine's platform as `docker load` reads
// it, tagged with the name.
func TestDockerArchive(t *testing.T) {
	dir := t.TempDir()
	amd, arm := rootfs(t, "amd64"), rootfs(t, "arm64")
	da := filepath.Join(dir, "docker.tar")
	if err := run(context.Background(), buildArgs(filepath.Join(dir, "oci.tar"), amd, arm, "--docker-archive", da), &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("registry.example/gpud:v1.2.3")
	img, err := tarball.ImageFromPath(da, &tag)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil || cf.Architecture != runtime.GOARCH {
		t.Errorf("docker archive config: %+v, %v", cf, err)
	}
}

// Bad input: a clear error naming what is wrong, and no archive left.
func TestBuildRejects(t *testing.T) {
	amd := rootfs(t, "amd64")
	out := filepath.Join(t.TempDir(), "x.tar")
	fifo := rootfs(t, "amd64")
	if err := syscall.Mkfifo(filepath.Join(fifo, "pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"build", "--name", "reg.example/b:c", "--out", out, "--platform", "linux/amd64=" + amd}, "--epoch is required"},
		{[]string{"build", "--name", "reg.example/b:c", "--out", out, "--epoch", "-1", "--platform", "linux/amd64=" + amd}, "--epoch"},
		{[]string{"build", "--name", "reg.example/b:c", "--out", out, "--epoch", "1"}, "at least one --platform"},
		{[]string{"build", "--name", "reg.example/b:c", "--out", out, "--epoch", "1", "--platform", "amd64"}, "want os/arch"},
		{[]string{"build", "--name", "reg.example/b:c", "--out", out, "--epoch", "1", "--platform", "linux/amd64=" + amd, "--platform", "linux/amd64=" + amd}, "given twice"},
		{[]string{"build", "--name", "Bad Name", "--out", out, "--epoch", "1", "--platform", "linux/amd64=" + amd}, "--name"},
		{[]string{"build", "--name", "reg.example/b:c", "--out", out, "--epoch", "1", "--platform", "linux/amd64=" + fifo}, "not a regular file"},
		{[]string{"build", "--name", "reg.example/b:c", "--out", out, "--epoch", "1", "--platform", "linux/amd64=" + amd, "--label", "=x"}, "--label"},
		{[]string{"build", "--name", "reg.example/b:c", "--out", out, "--epoch", "1", "--platform", "linux/arm64=" + amd, "--docker-archive", out + ".d"}, "no linux/"},
		{[]string{"build", "--nme", "reg.example/b:c"}, "unknown flag --nme"},
		{[]string{"frobnicate"}, "unknown command"},
	} {
		err := run(context.Background(), c.args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error with %q", c.args, err, c.want)
		}
	}
	if runtime.GOARCH != "arm64" {
		if _, err := os.Stat(out + ".d"); err == nil {
			t.Error("a failed build left a docker archive")
		}
	}
}

// An archive that is not ociimage's (links, names leaving the directory,
// several images) is refused before anything is pushed.
func TestReadArchiveRejects(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, entries ...tar.Header) string {
		p := filepath.Join(dir, name)
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, h := range entries {
			h := h
			tw.WriteHeader(&h)
		}
		tw.Close()
		os.WriteFile(p, b.Bytes(), 0o644)
		return p
	}
	for _, c := range []struct {
		archive, want string
	}{
		{write("link.tar", tar.Header{Name: "index.json", Typeflag: tar.TypeSymlink, Linkname: "/etc/shadow"}), "only files and directories"},
		{write("escape.tar", tar.Header{Name: "../../x", Typeflag: tar.TypeReg, Mode: 0o644}), "leaves the archive"},
		{write("empty.tar"), "index.json"},
	} {
		_, _, _, err := readArchive(c.archive)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", filepath.Base(c.archive), err, c.want)
		}
	}
}

// FuzzReadArchive: whatever bytes stand in an archive, reading it ends in
// an index or an error, never a panic, and never writes outside its own
// temporary directory (untar refuses names that leave it and links).
func FuzzReadArchive(f *testing.F) {
	dir := f.TempDir()
	good := filepath.Join(dir, "good.tar")
	amd := filepath.Join(dir, "rootfs")
	os.MkdirAll(filepath.Join(amd, "etc"), 0o755)
	os.WriteFile(filepath.Join(amd, "gpud"), []byte("x"), 0o755)
	if err := run(context.Background(), []string{"build", "--name", "reg.example/gpud:1", "--out", good, "--epoch", "1",
		"--platform", "linux/amd64=" + amd}, &bytes.Buffer{}); err != nil {
		f.Fatal(err)
	}
	b, _ := os.ReadFile(good)
	f.Add(b)
	f.Add([]byte{})
	f.Add(b[:len(b)/2])
	outside := filepath.Join(dir, "outside")
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(t.TempDir(), "a.tar")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		idx, _, done, err := readArchive(p)
		if err == nil {
			idx.Digest()
			done()
		}
		if _, err := os.Lstat(outside); err == nil {
			t.Fatal("an archive wrote outside its directory")
		}
	})
}
