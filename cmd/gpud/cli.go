package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/gpud/gpud/internal/daemon"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/status"
)

func cmdStatus(args []string) error {
	fs := newFlagSet("status")
	stateFile := fs.String("state-file", "/run/gpud/state.json", "state file to read")
	output := fs.String("o", "table", "output format: table|json")
	watch := fs.Duration("watch", 0, "refresh every interval (e.g. 1s) until interrupted")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *output != "table" && *output != "json" {
		return usagef("status: -o %q: want table or json", *output)
	}
	for {
		f, err := occupancy.ReadStateFile(*stateFile)
		if err != nil {
			return fmt.Errorf("status: %w (is gpud running?)", err)
		}
		if *watch > 0 {
			fmt.Print("\033[H\033[2J")
		}
		if *output == "json" {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			if err := enc.Encode(f); err != nil {
				return err
			}
		} else if err := status.Render(os.Stdout, f, time.Now()); err != nil {
			return err
		}
		if *watch <= 0 {
			return nil
		}
		time.Sleep(*watch)
	}
}

func cmdMonitor(args []string) error {
	fs := newFlagSet("monitor")
	socket := fs.String("control-socket", "/run/gpud/gpud.sock", "control socket of the running daemon")
	if len(args) == 0 {
		return usagef("monitor: want on or off")
	}
	what := args[len(args)-1]
	if err := parse(fs, args[:len(args)-1]); err != nil {
		return err
	}
	var on string
	switch what {
	case "on":
		on = "true"
	case "off":
		on = "false"
	default:
		return usagef("monitor: %q: want on or off", what)
	}
	resp, err := daemon.ControlClient(*socket).Post("http://gpud/v1/monitoring?on="+on, "text/plain", nil)
	if err != nil {
		return fmt.Errorf("monitor: %w (is gpud running?)", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("monitor: %s", body)
	}
	fmt.Print(string(body))
	return nil
}
