package status

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"go.yaml.in/yaml/v3"

	v1 "github.com/gpud/gpud/api/v1"
)

// The -o vocabulary of every gpud command that prints: Formats where the
// output is a list (a table, and a wide one with every column whole),
// RecordFormats where it is one record (text). json and yaml are the same
// document everywhere (Encode).
var (
	// Formats are `gpud status -o`'s values.
	Formats = []string{"table", "wide", "json", "yaml"}
	// RecordFormats are the values of a command printing one record
	// (gpud explain, gpud version).
	RecordFormats = []string{"text", "json", "yaml"}
	// ExplainFormats are `gpud explain -o`'s values.
	ExplainFormats = RecordFormats
)

// Write writes the state file in format (one of Formats).
func Write(w io.Writer, f *v1.StateFile, format string, now time.Time) error {
	switch format {
	case "table":
		return Render(w, f, now)
	case "wide":
		return RenderWide(w, f, now)
	}
	return Encode(w, f, format)
}

// WriteExplain writes an explanation in format (one of ExplainFormats).
func WriteExplain(w io.Writer, e *v1.Explanation, format string) error {
	if format == "text" {
		return RenderExplain(w, e)
	}
	return Encode(w, e, format)
}

// WriteRecord writes one record in format (one of RecordFormats): text by
// text, json and yaml by Encode.
func WriteRecord(w io.Writer, v any, format string, text func(io.Writer) error) error {
	if format == "text" {
		return text(w)
	}
	return Encode(w, v, format)
}

// Encode writes v as indented JSON, or as YAML with the same keys in the
// same order (the JSON document's, so that -o yaml and -o json name every
// field alike).
func Encode(w io.Writer, v any, format string) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("status: encoding: %w", err)
	}
	switch format {
	case "json":
		_, err = w.Write(append(b, '\n'))
		return err
	case "yaml":
		// JSON is YAML: decoded into a node it keeps the keys' order; its
		// flow style ({...}) and quotes are dropped so that the encoder
		// writes block YAML, quoting only what needs it.
		var n yaml.Node
		if err := yaml.Unmarshal(b, &n); err != nil {
			return fmt.Errorf("status: yaml: %w", err)
		}
		plain(&n)
		var out bytes.Buffer
		enc := yaml.NewEncoder(&out)
		enc.SetIndent(2)
		if err := enc.Encode(&n); err != nil {
			return fmt.Errorf("status: yaml: %w", err)
		}
		if err := enc.Close(); err != nil {
			return fmt.Errorf("status: yaml: %w", err)
		}
		_, err = w.Write(out.Bytes())
		return err
	}
	return fmt.Errorf("status: unknown format %q", format)
}

// plain clears a node tree's styles (bounded by the document's depth,
// which json.Marshal of gpud's types keeps small).
func plain(n *yaml.Node) {
	n.Style = 0
	for _, c := range n.Content {
		plain(c)
	}
}

// WatchOptions say where and how often Watch writes.
type WatchOptions struct {
	Out, Err io.Writer
	// Terminal: Out is a terminal, where each table replaces the last on
	// the screen. Elsewhere (a pipe, a file) frames follow one another
	// with no escape codes.
	Terminal bool
	Every    time.Duration
	Format   string // one of Formats
}

// clearScreen is the VT100 home-and-clear sequence, for terminals only.
const clearScreen = "\033[H\033[2J"

// Watch writes a frame at once and then every o.Every until ctx ends; a
// frame that fails is reported on o.Err and the watch goes on. Each frame
// is written whole, in one write: a reader of a pipe never sees half of
// one. Tables are cleared in place on a terminal and separated by a blank
// line elsewhere; YAML frames are documents of a stream (---), JSON frames
// a sequence of documents (as jq reads them).
func Watch(ctx context.Context, o WatchOptions, frame func(io.Writer) error) {
	t := time.NewTicker(o.Every)
	defer t.Stop()
	for n := 0; ; n++ {
		var b bytes.Buffer
		table := o.Format == "table" || o.Format == "wide"
		switch {
		case table && o.Terminal:
			b.WriteString(clearScreen)
		case table && n > 0:
			b.WriteByte('\n')
		case o.Format == "yaml":
			b.WriteString("---\n")
		}
		if err := frame(&b); err != nil {
			fmt.Fprintln(o.Err, "gpud:", err)
		} else {
			_, _ = o.Out.Write(b.Bytes())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
