package httpserve

import (
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/safefs"
	"github.com/gpud/gpud/internal/testutil"
)

// webConfig is a web config with a self-signed certificate and one user
// (prometheus / secret) in a root-owned directory, as a mounted Secret.
func webConfig(t *testing.T) string {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return testutil.WebConfig(t, dir, dir, "prometheus", "secret")
}

// With a web config the port is HTTPS with basic auth: plain HTTP gets no
// answer, no or wrong credentials get 401, the scraper's get the page.
func TestServeWebTLSAndAuth(t *testing.T) {
	cfg := webConfig(t)
	if err := CheckWebConfig(cfg); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "gpud_up 1\n") })
	s := ServeWeb(ln, h, Limits{}, cfg, "metrics", slog.New(slog.DiscardHandler))
	defer s.Close()
	url := "https://" + ln.Addr().String() + "/metrics"
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}

	if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + ln.Addr().String() + "/metrics"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK && strings.Contains(string(b), "gpud_up") {
			t.Errorf("plain HTTP served the metrics")
		}
	}
	for _, tc := range []struct {
		user, pass string
		want       int
	}{{"", "", http.StatusUnauthorized}, {"prometheus", "wrong", http.StatusUnauthorized}, {"prometheus", "secret", http.StatusOK}} {
		req, _ := http.NewRequest("GET", url, nil)
		if tc.user != "" {
			req.SetBasicAuth(tc.user, tc.pass)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.user, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want || (tc.want == http.StatusOK) != strings.Contains(string(b), "gpud_up 1") {
			t.Errorf("user %q password %q: %d %q, want %d", tc.user, tc.pass, resp.StatusCode, b, tc.want)
		}
	}
}

// A web config gpud cannot trust or use is refused before gpud serves:
// missing, unparsable, naming a missing certificate, or writable by others.
func TestCheckWebConfig(t *testing.T) {
	cfg := webConfig(t)
	dir := filepath.Dir(cfg)
	bad := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for what, path := range map[string]string{
		"missing":          filepath.Join(dir, "nope.yml"),
		"not YAML":         bad("garbage.yml", "tls_server_config: [\n"),
		"unknown key":      bad("typo.yml", "tls_server_confg: {}\n"),
		"missing cert":     bad("nocert.yml", "tls_server_config:\n  cert_file: /nonexistent.crt\n  key_file: /nonexistent.key\n"),
		"plain-text users": bad("plain.yml", "basic_auth_users:\n  prometheus: secret\n"),
	} {
		if err := CheckWebConfig(path); err == nil {
			t.Errorf("%s: accepted", what)
		}
	}
	if err := os.Chmod(cfg, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := CheckWebConfig(cfg); !errors.Is(err, safefs.ErrUnsafe) {
		t.Errorf("a web config others can write: %v, want ErrUnsafe", err)
	}
}

// A Secret volume's layout (root's symlinks into a timestamped directory)
// is accepted; a symlink another user owns is not followed.
func TestCheckWebConfigThroughSecretSymlinks(t *testing.T) {
	cfg := webConfig(t)
	dir := filepath.Dir(cfg)
	mount := filepath.Join(dir, "mount")
	ts := filepath.Join(mount, "..2026_11_24_13_00_00.123")
	if err := os.MkdirAll(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(cfg)
	os.WriteFile(filepath.Join(ts, "web.yml"), b, 0o644)
	os.Symlink(filepath.Base(ts), filepath.Join(mount, "..data"))
	os.Symlink("..data/web.yml", filepath.Join(mount, "web.yml"))
	// kubelet makes the mount point root's, world-writable and sticky.
	if err := os.Chmod(mount, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if err := CheckWebConfig(filepath.Join(mount, "web.yml")); err != nil {
		t.Errorf("a Secret volume's web config: %v", err)
	}
	// Not sticky: anyone could replace web.yml.
	if err := os.Chmod(mount, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := CheckWebConfig(filepath.Join(mount, "web.yml")); !errors.Is(err, safefs.ErrUnsafe) {
		t.Errorf("a web config in a world-writable directory: %v, want ErrUnsafe", err)
	}
	os.Chmod(mount, 0o755)
	if err := os.Lchown(filepath.Join(mount, "web.yml"), 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := CheckWebConfig(filepath.Join(mount, "web.yml")); err == nil {
		t.Error("followed a symlink another user owns")
	}
}
