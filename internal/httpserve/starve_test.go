package httpserve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Starving the metrics port (issue 32, item 7): any pod reaches a
// hostNetwork port. These tests use loopback source addresses
// 127.0.0.2... as distinct peers.

// share is Defaults.MaxConnsPerPeer (written out so that these tests ran
// at the code before it).
const share = 8

// serveTest serves /healthz on a loopback port within l.
func serveTest(t *testing.T, l Limits) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	s := Serve(ln, h, l, "test", slog.New(slog.DiscardHandler))
	t.Cleanup(func() { s.Close() })
	return ln.Addr().String()
}

// dialFrom connects to addr from the loopback address from.
func dialFrom(from, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 2 * time.Second}
	return d.Dial("tcp", addr)
}

// get sends GET /healthz from the loopback address from on a new
// connection and says how long the answer took, or why none came within
// limit.
func get(from, addr string, limit time.Duration) (time.Duration, error) {
	start := time.Now()
	client := &http.Client{Timeout: limit, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
			return d.DialContext(ctx, network, a)
		},
	}}
	resp, err := client.Get("http://" + addr + "/healthz")
	if err != nil {
		return time.Since(start), err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(b) != "ok\n" {
		return time.Since(start), fmt.Errorf("%d %q", resp.StatusCode, b)
	}
	return time.Since(start), nil
}

// More idle keep-alive connections from one address than the whole cap
// neither keep a scraper on another address out nor a new request from
// that same address: one peer holds its share, and an idle connection
// gives way to a new one. At the old code the first 64 held every slot
// for the idle timeout (30 s).
func TestIdleFloodFromOnePeer(t *testing.T) {
	addr := serveTest(t, Limits{}) // the defaults: 64 connections, 30 s idle
	const n = 80
	var open atomic.Int32
	for range n {
		c, err := dialFrom("127.0.0.2", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		open.Add(1)
		io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		go func() {
			io.Copy(io.Discard, c) // the answer, then until gpud closes it
			open.Add(-1)
		}()
	}
	for _, from := range []string{"127.0.0.3", "127.0.0.2"} {
		if took, err := get(from, addr, 2*time.Second); err != nil {
			t.Errorf("a request from %s while %d idle connections came from 127.0.0.2: %v after %s", from, n, err, took)
		}
	}
	// One peer's share (8), the request above included, stays open.
	deadline := time.Now().Add(2 * time.Second)
	for open.Load() > share && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := open.Load(); got > share {
		t.Errorf("%d of 127.0.0.2's %d idle connections held, want at most its share %d", got, n, share)
	}
}

// slowloris connects from from and sends a header line every period,
// never finishing; it returns how long the connection stayed open, or
// limit if it still was then.
func slowloris(from, addr string, period, limit time.Duration) (time.Duration, error) {
	c, err := dialFrom(from, addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	start := time.Now()
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\n"); err != nil {
		return time.Since(start), nil
	}
	buf := make([]byte, 512)
	for i := 0; time.Since(start) < limit; i++ {
		c.SetReadDeadline(time.Now().Add(period))
		_, err := c.Read(buf)
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			return time.Since(start), nil // an answer (400, 408) or closed
		}
		if _, err := fmt.Fprintf(c, "X-Slow-%d: y\r\n", i); err != nil {
			return time.Since(start), nil
		}
	}
	return limit, nil
}

// 200 clients sending a header line every 200 ms, from 25 addresses, are
// all closed within the header deadline of their accept (plus slack), and a
// /healthz from another address is answered meanwhile. At the old code 64
// were served and the rest waited in the kernel's accept queue, where no
// deadline reached them: the last ones were closed after several header
// timeouts, and /healthz waited behind them.
func TestSlowlorisClosedFromAccept(t *testing.T) {
	const headers = time.Second
	addr := serveTest(t, Limits{ReadHeaderTimeout: headers})
	const n, peers = 200, 25
	slack := 1500 * time.Millisecond
	var wg sync.WaitGroup
	took := make(chan time.Duration, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := slowloris(fmt.Sprintf("127.0.1.%d", 10+i%peers), addr, 200*time.Millisecond, headers+slack)
			if err != nil {
				t.Errorf("slowloris %d: %v", i, err)
			}
			took <- d
		}()
	}
	time.Sleep(100 * time.Millisecond) // most of them connected
	if d, err := get("127.0.0.3", addr, headers); err != nil {
		t.Errorf("/healthz while %d slowloris clients were connected: %v after %s", n, err, d)
	}
	wg.Wait()
	close(took)
	var longest time.Duration
	late := 0
	for d := range took {
		longest = max(longest, d)
		if d >= headers+slack {
			late++
		}
	}
	if late > 0 {
		t.Errorf("%d of %d slowloris clients still open %s after they connected (header deadline %s)", late, n, headers+slack, headers)
	}
	t.Logf("longest slowloris connection: %s", longest)
}

// A flood from one address that reconnects as soon as it is closed holds
// at most its share, and a scraper on another address is answered all the
// while. At the old code the flood held every slot.
func TestReconnectingFloodHoldsItsShare(t *testing.T) {
	headers := 2 * time.Second
	addr := serveTest(t, Limits{ReadHeaderTimeout: headers})
	const flooders = 80
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	// held counts the flood's connections open for more than hold: a
	// refused one is closed at once.
	hold := 300 * time.Millisecond
	var held, peak atomic.Int32
	var wg sync.WaitGroup
	for range flooders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				c, err := dialFrom("127.0.0.2", addr)
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost:")
				done := make(chan struct{})
				go func() { io.Copy(io.Discard, c); close(done) }()
				counted := false
				select {
				case <-done:
				case <-time.After(hold):
					counted = true
					for h := held.Add(1); ; {
						if p := peak.Load(); h <= p || peak.CompareAndSwap(p, h) {
							break
						}
					}
					select {
					case <-done:
					case <-ctx.Done():
					}
				case <-ctx.Done():
				}
				if counted {
					held.Add(-1)
				}
				c.Close()
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	time.Sleep(hold)
	for i := 0; ctx.Err() == nil; i++ {
		if took, err := get("127.0.0.3", addr, time.Second); err != nil && ctx.Err() == nil {
			t.Errorf("scrape %d during a reconnecting flood from 127.0.0.2: %v after %s", i, err, took)
		}
		time.Sleep(100 * time.Millisecond)
	}
	wg.Wait()
	// The peak sample can race a close and a reopen by one.
	if p := peak.Load(); p > share+1 {
		t.Errorf("the flood held %d connections at once, its share is %d", p, share)
	}
}
