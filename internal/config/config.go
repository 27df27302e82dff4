// Package config gives a command's settings three sources besides their
// defaults: command-line flags, GPUD_* environment variables and an optional
// YAML file with a version. The command's flag set stays the one list of
// names, defaults and help: an environment variable is the flag's name upper
// cased with '-' turned into '_' after the prefix (--idle-after:
// GPUD_IDLE_AFTER), and a file key is the flag's name (idle-after: 5m).
// Values from every source go through the flag's own Set, so they are
// checked alike. Precedence: flag > environment > file > default.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/gpud/gpud/internal/safefs"
)

// Version is the only file version this gpud reads.
const Version = "v1"

// EnvPrefix starts every setting's environment variable.
const EnvPrefix = "GPUD_"

// FileFlag names the flag (and GPUD_CONFIG, its variable) giving the file.
const FileFlag = "config"

// MaxFileSize bounds the file: a settings file is a few hundred bytes.
const MaxFileSize = 1 << 20

// Error is a bad setting: one line naming the key and where its value came
// from.
type Error struct {
	Key    string // the setting (flag name); "" for the file as a whole
	Origin string // "flag --idle-after", "env GPUD_IDLE_AFTER", "file /etc/gpud.yaml:3"
	Msg    string
}

func (e *Error) Error() string {
	if e.Key == "" {
		return e.Origin + ": " + e.Msg
	}
	return fmt.Sprintf("%s (%s): %s", e.Key, e.Origin, e.Msg)
}

// EnvName is the environment variable of the setting named name.
func EnvName(name string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// Sources are the environment and the file system, replaceable in tests.
type Sources struct {
	LookupEnv func(string) (string, bool)  // default os.LookupEnv
	ReadFile  func(string) ([]byte, error) // default: safefs.ReadFile, at most MaxFileSize
	// FlagOnly names flags that are actions rather than settings (gpud
	// run --uninstall): only the command line sets them; in the file they
	// are unknown keys, and their variables are not read.
	FlagOnly []string
	// Environ lists the environment, for the GPUD_* variables that are no
	// setting's (default os.Environ).
	Environ func() []string
	// NotSettings are GPUD_* variables that are known but no setting (the
	// ones gpud gives workloads): never reported as unknown.
	NotSettings []string
}

func (s Sources) lookupEnv(k string) (string, bool) {
	if s.LookupEnv != nil {
		return s.LookupEnv(k)
	}
	return os.LookupEnv(k)
}

func (s Sources) environ() []string {
	if s.Environ != nil {
		return s.Environ()
	}
	return os.Environ()
}

func (s Sources) readFile(p string) ([]byte, error) {
	if s.ReadFile != nil {
		return s.ReadFile(p)
	}
	// Whoever can change the file chooses gpud's settings (its directories,
	// its default priority, what it kills): it falls under the rule of
	// gpud's own directories, at start and at each SIGHUP alike.
	b, err := safefs.ReadFile(p, MaxFileSize)
	if errors.Is(err, safefs.ErrUnsafe) {
		return nil, fmt.Errorf("%s: %w (the settings file must be root's, not writable by others, in directories only root can change, reached through no symlink another user made)", p, err)
	}
	return b, err
}

// Settings is a flag set filled from every source.
type Settings struct {
	FS     *pflag.FlagSet
	File   string            // the file read, "" when none
	origin map[string]string // flag name → where its value came from
	// UnknownEnv are the GPUD_* variables of the environment that no
	// setting reads, sorted: a misspelt one would otherwise be ignored
	// without a word (the file's unknown keys are errors; a variable may
	// be meant for another gpud, so it is only reported).
	UnknownEnv []UnknownVar
}

// UnknownVar is a GPUD_* variable no setting reads.
type UnknownVar struct {
	Name string
	// Suggestion is the setting's variable it is closest to, "" if none
	// is close.
	Suggestion string
	// Action is the command-line-only flag (Sources.FlagOnly) whose
	// variable this would be, "" if none.
	Action string
}

func (u UnknownVar) String() string {
	switch {
	case u.Action != "":
		return fmt.Sprintf("variable %s is not read (--%s is an action: command line only)", u.Name, u.Action)
	case u.Suggestion != "":
		return fmt.Sprintf("unknown variable %s (did you mean %s?)", u.Name, u.Suggestion)
	}
	return fmt.Sprintf("unknown variable %s (no setting of this name)", u.Name)
}

// Origin says where name's value came from: "default", "flag --name",
// "env GPUD_NAME" or "file PATH:LINE".
func (s *Settings) Origin(name string) string {
	if o, ok := s.origin[name]; ok {
		return o
	}
	return "default"
}

// Explicit reports whether name was set by any source (not its default).
func (s *Settings) Explicit(name string) bool {
	_, ok := s.origin[name]
	return ok
}

// Invalid returns an Error for name, naming where its value came from: for
// checks that span more than one flag's Set (a duration that must be
// positive, say).
func (s *Settings) Invalid(name, format string, args ...any) error {
	return &Error{Key: name, Origin: s.Origin(name), Msg: oneLine(fmt.Sprintf(format, args...))}
}

// Values returns every setting's value as text, for telling what a reload
// changed.
func (s *Settings) Values() map[string]string {
	out := map[string]string{}
	s.FS.VisitAll(func(f *pflag.Flag) { out[f.Name] = f.Value.String() })
	return out
}

// Changed lists, sorted, the settings whose values differ between a and b.
func Changed(a, b map[string]string) []string {
	var out []string
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			out = append(out, k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// Load parses args into fs and fills it from the other sources: the file
// named by --config (else GPUD_CONFIG) first, then the environment, then
// the command line again, so that each later source wins and every value
// from every source is checked by its flag. fs must have a string flag
// named FileFlag. pflag.ErrHelp is returned as is; any other error is one
// line, an *Error when a setting is to blame.
func Load(fs *pflag.FlagSet, args []string, src Sources) (*Settings, error) {
	s := &Settings{FS: fs, origin: map[string]string{}}
	cfgFlag := fs.Lookup(FileFlag)
	if cfgFlag == nil {
		return nil, fmt.Errorf("config: flag set %q has no --%s flag", fs.Name(), FileFlag)
	}
	if err := parseArgs(fs, args); err != nil {
		return nil, err
	}
	explicit := map[string]bool{}
	fs.Visit(func(f *pflag.Flag) { explicit[f.Name] = true })

	path, pathOrigin := cfgFlag.Value.String(), "flag --"+FileFlag
	if !explicit[FileFlag] {
		path, pathOrigin = "", "env "+EnvName(FileFlag)
		if v, ok := src.lookupEnv(EnvName(FileFlag)); ok {
			path = v
			if err := fs.Set(FileFlag, v); err != nil {
				return nil, s.setError(cfgFlag, pathOrigin, v, err)
			}
			s.origin[FileFlag] = pathOrigin
		}
	}
	if path != "" {
		data, err := src.readFile(path)
		if err != nil {
			return nil, &Error{Key: FileFlag, Origin: pathOrigin, Msg: oneLine(err.Error())}
		}
		entries, err := ParseFile(path, data)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			origin := fmt.Sprintf("file %s:%d", path, e.Line)
			f := fs.Lookup(e.Key)
			if f == nil || e.Key == FileFlag || slices.Contains(src.FlagOnly, e.Key) {
				hint := ""
				if f == nil {
					hint = didYouMean(closest(fs, e.Key, append([]string{FileFlag}, src.FlagOnly...)))
				}
				return nil, &Error{Key: keyName(e.Key), Origin: origin, Msg: "unknown key" + hint}
			}
			if err := fs.Set(e.Key, e.Value); err != nil {
				return nil, s.setError(f, origin, e.Value, err)
			}
			s.origin[e.Key] = origin
		}
		s.File = path
	}

	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Name == FileFlag || slices.Contains(src.FlagOnly, f.Name) {
			return
		}
		name := EnvName(f.Name)
		v, ok := src.lookupEnv(name)
		if !ok {
			return
		}
		if e := fs.Set(f.Name, v); e != nil {
			err = s.setError(f, "env "+name, v, e)
			return
		}
		s.origin[f.Name] = "env " + name
	})
	if err != nil {
		return nil, err
	}

	// The command line last: it wins over the file and the environment.
	if err := parseArgs(fs, args); err != nil {
		return nil, err
	}
	for name := range explicit {
		s.origin[name] = "flag --" + name
	}
	s.UnknownEnv = unknownEnv(fs, src)
	return s, nil
}

// unknownEnv finds the GPUD_* variables of the environment that no flag of
// fs reads, each with the setting's variable it most likely misspells.
func unknownEnv(fs *pflag.FlagSet, src Sources) []UnknownVar {
	known := map[string]string{} // variable → its flag
	fs.VisitAll(func(f *pflag.Flag) { known[EnvName(f.Name)] = f.Name })
	var out []UnknownVar
	seen := map[string]bool{}
	for _, kv := range src.environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, EnvPrefix) || seen[name] || slices.Contains(src.NotSettings, name) {
			continue
		}
		seen[name] = true
		flag, ok := known[name]
		switch {
		case ok && slices.Contains(src.FlagOnly, flag):
			out = append(out, UnknownVar{Name: name, Action: flag})
		case !ok:
			u := UnknownVar{Name: name}
			asFlag := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(name, EnvPrefix), "_", "-"))
			if f := closest(fs, asFlag, src.FlagOnly); f != "" {
				u.Suggestion = EnvName(f)
			}
			out = append(out, u)
		}
	}
	slices.SortFunc(out, func(a, b UnknownVar) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// closest is the flag of fs that name most likely misspells (a slip of a
// key or two, not another word), "" if none is close; skip are never
// suggested.
func closest(fs *pflag.FlagSet, name string, skip []string) string {
	best, bestD := "", 0
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden || slices.Contains(skip, f.Name) {
			return
		}
		d := editDistance(name, f.Name)
		if d <= 2 && 3*d <= len(f.Name) && (best == "" || d < bestD) {
			best, bestD = f.Name, d
		}
	})
	return best
}

// didYouMean is an error's hint for a misspelt name.
func didYouMean(s string) string {
	if s == "" {
		return ""
	}
	return " (did you mean " + s + "?)"
}

// editDistance is the optimal string alignment distance between a and b:
// insertions, deletions, substitutions and swaps of adjacent characters
// (IDEL for IDLE) each count one.
func editDistance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// parseArgs parses the command line into fs: flags anywhere among the
// arguments (pflag), the single-dash long form of Go's flag package
// (-idle-after 5m) still accepted, and no positional argument.
func parseArgs(fs *pflag.FlagSet, args []string) error {
	err := fs.Parse(LongDashes(fs, args))
	if err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return err
		}
		var inv *pflag.InvalidValueError
		var req *pflag.ValueRequiredError
		var unknown *pflag.NotExistError
		switch {
		case errors.As(err, &inv):
			f := inv.GetFlag()
			return (&Settings{}).setError(f, "flag --"+f.Name, inv.GetValue(), inv.Unwrap())
		case errors.As(err, &req):
			name := req.GetFlag().Name
			return &Error{Key: name, Origin: "flag --" + name, Msg: "no value"}
		case errors.As(err, &unknown):
			if n := unknown.GetSpecifiedName(); n != "" {
				hint := ""
				if c := closest(fs, n, nil); c != "" {
					hint = didYouMean("--" + c)
				}
				return fmt.Errorf("unknown flag --%s%s", clip(n), hint)
			}
			return fmt.Errorf("unknown flag -%s", clip(unknown.GetSpecifiedShortnames()))
		}
		return errors.New(oneLine(err.Error()))
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", clip(fs.Arg(0)))
	}
	return nil
}

// LongDashes rewrites -name and -name=value, for a long flag name of fs,
// as --name: Go's flag package, which gpud's CLI used before pflag, took
// one dash or two, and scripts written then keep working. Shorthands (-o),
// values of flags (--node-name -x) and everything after "--" are left
// alone.
func LongDashes(fs *pflag.FlagSet, args []string) []string {
	out := make([]string, 0, len(args))
	takesValue := func(f *pflag.Flag) bool { return f != nil && f.NoOptDefVal == "" }
	for i := 0; i < len(args); i++ {
		a := args[i]
		out = append(out, a)
		if a == "--" {
			return append(out, args[i+1:]...)
		}
		if len(a) < 2 || a[0] != '-' {
			continue
		}
		var f *pflag.Flag
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch {
		case strings.HasPrefix(a, "--"):
			f = fs.Lookup(name)
		case len(name) > 1 && fs.Lookup(name) != nil:
			f = fs.Lookup(name)
			out[len(out)-1] = "-" + a
		case len(name) == 1:
			f = fs.ShorthandLookup(name)
			hasValue = hasValue || len(a) > 2 && !strings.Contains(a, "=")
		}
		if !hasValue && takesValue(f) && i+1 < len(args) {
			i++
			out = append(out, args[i])
		}
	}
	return out
}

// setError explains a value f refused.
func (s *Settings) setError(f *pflag.Flag, origin, value string, err error) error {
	var inv *pflag.InvalidValueError
	if errors.As(err, &inv) {
		err = inv.Unwrap() // fs.Set's wrapping repeats the flag and the value
	}
	msg := fmt.Sprintf("invalid value %q: %v", clip(value), err)
	switch f.Value.Type() {
	case "duration":
		msg = fmt.Sprintf("invalid duration %q (want e.g. 30s, 5m or 1h)", clip(value))
	case "bool":
		msg = fmt.Sprintf("invalid bool %q (want true or false)", clip(value))
	case "int", "int32", "int64", "uint", "uint32", "uint64", "float64":
		msg = fmt.Sprintf("invalid number %q", clip(value))
	}
	return &Error{Key: f.Name, Origin: origin, Msg: oneLine(msg)}
}

// Entry is one setting from the file.
type Entry struct {
	Key, Value string
	Line       int
}

// ParseFile reads a settings file: a YAML mapping with version: v1 and one
// scalar value per key, keys unique. Which keys exist is Load's business.
// It never panics; errors are one line naming the key when there is one.
func ParseFile(path string, data []byte) (entries []Entry, err error) {
	fileErr := func(line int, key, format string, args ...any) error {
		origin := "file " + path
		if line > 0 {
			origin = fmt.Sprintf("file %s:%d", path, line)
		}
		return &Error{Key: keyName(key), Origin: origin, Msg: oneLine(fmt.Sprintf(format, args...))}
	}
	defer func() {
		// The YAML decoder is third-party code fed untrusted bytes: a panic
		// in it is a bad file, not a dead daemon.
		if r := recover(); r != nil {
			entries, err = nil, fileErr(0, "", "unreadable YAML: %v", r)
		}
	}()
	if len(data) > MaxFileSize {
		return nil, fileErr(0, "", "larger than %d bytes", MaxFileSize)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fileErr(0, "version", "missing (want %s)", Version)
		}
		return nil, fileErr(0, "", "%v", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, fileErr(extra.Line, "", "more than one YAML document")
	} else if !errors.Is(err, io.EOF) {
		return nil, fileErr(0, "", "%v", err)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return nil, fileErr(0, "version", "missing (want %s)", Version)
		}
		root = root.Content[0]
	}
	root = deref(root)
	if root.Kind != yaml.MappingNode {
		if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
			return nil, fileErr(0, "version", "missing (want %s)", Version)
		}
		return nil, fileErr(root.Line, "", "want a mapping of settings (key: value)")
	}
	seen := map[string]int{}
	version, versionLine := "", 0
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := deref(root.Content[i]), deref(root.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			return nil, fileErr(k.Line, "", "a key must be a name")
		}
		if first, dup := seen[k.Value]; dup {
			return nil, fileErr(k.Line, k.Value, "duplicate key (first on line %d)", first)
		}
		seen[k.Value] = k.Line
		if v.Kind != yaml.ScalarNode {
			return nil, fileErr(k.Line, k.Value, "want a single value, not a list or mapping")
		}
		if v.Tag == "!!null" {
			return nil, fileErr(k.Line, k.Value, `no value (write "" for an empty string)`)
		}
		if k.Value == "version" {
			version, versionLine = v.Value, k.Line
			continue
		}
		entries = append(entries, Entry{Key: k.Value, Value: v.Value, Line: k.Line})
	}
	if versionLine == 0 {
		return nil, fileErr(0, "version", "missing (want %s)", Version)
	}
	if version != Version {
		return nil, fileErr(versionLine, "version", "unknown version %q (want %s)", clip(version), Version)
	}
	return entries, nil
}

// deref follows aliases (bounded: the decoder refuses alias cycles, but a
// bound costs nothing).
func deref(n *yaml.Node) *yaml.Node {
	for i := 0; i < 64 && n.Kind == yaml.AliasNode && n.Alias != nil; i++ {
		n = n.Alias
	}
	return n
}

// keyName shows a key from the file in an error: quoted when it is not a
// plain name, so that the error stays one line.
func keyName(k string) string {
	for _, r := range k {
		if !(r == '-' || r == '_' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return strconv.Quote(clip(k))
		}
	}
	return clip(k)
}

// clip bounds a value quoted in an error.
func clip(s string) string {
	const max = 64
	if utf8.RuneCountInString(s) <= max {
		return s
	}
	r := []rune(s)
	return string(r[:max]) + "…"
}

// oneLine keeps an error to one line.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	return strings.Join(strings.Fields(s), " ")
}

// Enum is a string pflag.Value that takes one of a few words.
type Enum struct {
	p       *string
	allowed []string
}

// NewEnum sets *p to def and returns a value accepting only allowed.
func NewEnum(p *string, def string, allowed ...string) *Enum {
	*p = def
	return &Enum{p: p, allowed: allowed}
}

func (e *Enum) Set(s string) error {
	if slices.Contains(e.allowed, s) {
		*e.p = s
		return nil
	}
	return fmt.Errorf("want %s", orList(e.allowed))
}

func (e *Enum) String() string {
	if e == nil || e.p == nil {
		return ""
	}
	return *e.p
}

// Type names the value in help (pflag.Value); the usage's `a|b` wins.
func (e *Enum) Type() string { return "string" }

func orList(w []string) string {
	switch len(w) {
	case 0:
		return "nothing"
	case 1:
		return w[0]
	}
	return strings.Join(w[:len(w)-1], ", ") + " or " + w[len(w)-1]
}

// List is a pflag.Value holding a comma-separated list. Each Set replaces
// the whole list (pflag's StringSlice appends after its first Set, and
// Load sets a flag once per source): "" is the empty list. Items are
// trimmed; empty items are dropped. check, when set, vets each item.
type List struct {
	p     *[]string
	check func(string) error
}

// NewList sets *p to a copy of def and returns a value for it.
func NewList(p *[]string, def []string, check func(string) error) *List {
	*p = slices.Clone(def)
	return &List{p: p, check: check}
}

func (l *List) Set(s string) error {
	out := []string{} // not nil: an empty list is a setting (Run.Complete fills only nil)
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if l.check != nil {
			if err := l.check(item); err != nil {
				return err
			}
		}
		out = append(out, item)
	}
	*l.p = out
	return nil
}

func (l *List) String() string {
	if l == nil || l.p == nil {
		return ""
	}
	return strings.Join(*l.p, ",")
}

// Type names the value in help (pflag.Value).
func (l *List) Type() string { return "strings" }
