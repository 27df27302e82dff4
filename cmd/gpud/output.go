package main

import (
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gpud/gpud/internal/status"
)

// The -o vocabulary: every command that prints something to be read
// (gpud status, explain, version) takes -o/--output with values from one
// of these lists, the first its default, and refuses any other value with
// the same error naming the allowed ones. Commands that print only a
// confirmation or a log (run, monitor, uninstall) take no -o.
var (
	// listOutputs: a table (80 columns), a wide one, or the document.
	listOutputs = status.Formats
	// recordOutputs: one record as text, or the document.
	recordOutputs = status.RecordFormats
)

// outputFlag defines -o (long --output; --o, Go's flag package's spelling
// of the old flag, still works) with formats, the vocabulary of c's output,
// checked as it is parsed, and completed.
func outputFlag(c *cobra.Command, p *string, def string, formats []string) {
	*p = def
	c.Flags().VarP(&outputValue{cmd: c.Name(), p: p, formats: formats}, "output", "o", "output format: "+joinOr(formats))
	c.Flags().SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		if name == "o" {
			name = "output"
		}
		return pflag.NormalizedName(name)
	})
	_ = c.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(formats, cobra.ShellCompDirectiveNoFileComp))
}

// outputValue is -o's value: one of formats.
type outputValue struct {
	cmd     string
	p       *string
	formats []string
}

func (o *outputValue) Set(s string) error {
	if err := checkFormat(o.cmd, s, o.formats); err != nil {
		return err
	}
	*o.p = s
	return nil
}

func (o *outputValue) String() string { return *o.p }
func (o *outputValue) Type() string   { return "string" }

func joinOr(w []string) string {
	s := ""
	for i, x := range w {
		switch {
		case i == 0:
		case i == len(w)-1:
			s += " or "
		default:
			s += ", "
		}
		s += x
	}
	return s
}

// checkFormat is -o's error, the same for every command: `status: -o
// "xml": want table, wide, json or yaml`.
func checkFormat(cmd, got string, formats []string) error {
	for _, f := range formats {
		if got == f {
			return nil
		}
	}
	return usagef("%s: -o %q: want %s", cmd, got, joinOr(formats))
}

// noArgs refuses a positional argument, naming it as such (cobra.NoArgs
// calls it an unknown command, which sends an admin looking for a
// command that does not exist).
func noArgs(c *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s: unexpected argument %q", c.Name(), args[0])
	}
	return nil
}
