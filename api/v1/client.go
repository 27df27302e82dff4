package v1

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DefaultSocket is where `gpud run` serves its control API by default.
const DefaultSocket = "/run/gpud/gpud.sock"

// maxAnswer bounds what the client reads of one answer.
const maxAnswer = 4 << 20

// RefusedError is an answer other than 200 OK: gpud's reason, as it said it.
type RefusedError struct {
	Status int    // the HTTP status
	Reason string // gpud's one line
}

func (e *RefusedError) Error() string { return e.Reason }

// Client talks to a running gpud over its control socket (root only):
//
//	GET  /v1/state             the state document, as in the state file
//	POST /v1/monitoring?on=B   the monitoring switch
//	GET  /v1/explain?pid=N     which rule applies to process N now
type Client struct {
	HTTP *http.Client
}

// NewClient returns a client for the control socket at path.
func NewClient(socket string) *Client {
	return &Client{HTTP: &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}},
	}}
}

// Explain asks which rule applies to process pid now.
func (c *Client) Explain(ctx context.Context, pid int) (*Explanation, error) {
	var e Explanation
	if err := c.do(ctx, http.MethodGet, "/v1/explain?pid="+strconv.Itoa(pid), &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// State returns the state document.
func (c *Client) State(ctx context.Context) (*StateFile, error) {
	var f StateFile
	if err := c.do(ctx, http.MethodGet, "/v1/state", &f); err != nil {
		return nil, err
	}
	return &f, nil
}

// SetMonitoring flips the monitoring switch; the answer is gpud's line.
func (c *Client) SetMonitoring(ctx context.Context, on bool) (string, error) {
	var line string
	err := c.do(ctx, http.MethodPost, "/v1/monitoring?on="+strconv.FormatBool(on), &line)
	return line, err
}

// do sends one request; into is decoded from JSON, or a *string gets the
// body as text.
func (c *Client) do(ctx context.Context, method, path string, into any) error {
	req, err := http.NewRequestWithContext(ctx, method, "http://gpud"+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("%w (is gpud running?)", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return fmt.Errorf("reading gpud's answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return &RefusedError{Status: resp.StatusCode, Reason: strings.TrimSpace(string(body))}
	}
	if s, ok := into.(*string); ok {
		*s = string(body)
		return nil
	}
	if err := json.Unmarshal(body, into); err != nil {
		return fmt.Errorf("unreadable answer from gpud: %w", err)
	}
	return nil
}
