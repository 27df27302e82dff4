package httpserve

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/testutil"
)

func TestWithDefaults(t *testing.T) {
	l := Limits{MaxConns: 3, IdleTimeout: time.Second}.WithDefaults()
	want := Defaults
	want.MaxConns, want.MaxConnsPerPeer, want.IdleTimeout = 3, 3, time.Second
	if l != want {
		t.Fatalf("WithDefaults = %+v, want %+v", l, want)
	}
}

// With the cap reached a third client is answered at once and the longest
// idle connection is closed for it; idle ones are closed after
// IdleTimeout; a client that never finishes its headers is closed after
// ReadHeaderTimeout.
//
// Two servers, so that no deadline here is a guess about the machine's
// speed: the first's idle timeout is far longer than any wait, so a close
// it makes can only be the cap's; the second's are short, and the test
// waits for the close it must make (a loaded CI machine once took more
// than 150 ms for the first server's close).
func TestServeBounds(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	serve := func(l Limits) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s := Serve(ln, h, l, "test", slog.New(slog.DiscardHandler))
		t.Cleanup(func() { s.Close() })
		return ln.Addr().String()
	}
	// request sends one keep-alive request on a new connection; the
	// returned channel gets the status line, then "closed" when the
	// server closed it.
	request := func(addr string) chan string {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		ch := make(chan string, 2)
		go func() {
			rd := bufio.NewReader(c)
			line, _ := rd.ReadString('\n')
			ch <- strings.TrimSpace(line)
			io.Copy(io.Discard, rd)
			ch <- "closed"
		}()
		return ch
	}
	wait := testutil.Wait(10 * time.Second)
	recv := func(ch chan string, what string) string {
		t.Helper()
		select {
		case got := <-ch:
			return got
		case <-time.After(wait):
			t.Fatalf("%s: not within %v", what, wait)
			return ""
		}
	}

	long := time.Hour // never reached: a close below is the cap's
	addr := serve(Limits{MaxConns: 2, IdleTimeout: long, ReadHeaderTimeout: long})
	ch1 := request(addr)
	if got := recv(ch1, "first client's answer"); !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Fatalf("status %q", got)
	}
	ch2 := request(addr)
	if got := recv(ch2, "second client's answer"); !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Fatalf("status %q", got)
	}
	ch3 := request(addr)
	if got := recv(ch3, "the third client answered while two idle connections held the slots"); !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Fatalf("third client: %q", got)
	}
	recv(ch1, "the longest idle connection closed for the third client")
	select {
	case <-ch2:
		t.Fatal("the second connection was closed too; only the longest idle one should be")
	default:
	}

	idle := 300 * time.Millisecond
	addr = serve(Limits{MaxConns: 2, IdleTimeout: idle, ReadHeaderTimeout: idle})
	ch := request(addr)
	if got := recv(ch, "answer"); !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Fatalf("status %q", got)
	}
	recv(ch, "an idle keep-alive connection closed after IdleTimeout")

	// Headers never finished.
	slow, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	io.WriteString(slow, "GET / HTTP/1.1\r\nHost:")
	slow.SetReadDeadline(time.Now().Add(wait))
	if _, err := io.Copy(io.Discard, slow); err != nil {
		t.Fatalf("a client with unfinished headers was not closed: %v", err)
	}
}
