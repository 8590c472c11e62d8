package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// exitError carries the exit status of a failed command.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }

var commands = map[string]func(args []string, stdout io.Writer) error{
	"node":  runNode,
	"ping":  runPing,
	"bench": runBench,
	"topo":  runTopo,
	"top":   runTop,
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: ferry <command> [flags]

commands:
  node   run one node of a cluster until SIGINT or SIGTERM
  ping   join as a node of the config and measure round trips to another node
  bench  join as a node of the config and measure tensor transfers to another node
  topo   print the data channel chosen for every pair of nodes and devices, and the control transport (shm or tcp), and why
  top    live view of a running cluster from its nodes' metrics (bytes/s, latency, budgets...)

Run "ferry <command> -h" for the flags of a command.
`)
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "ferry: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	if err := cmd(args[1:], stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "ferry %s: %v\n", args[0], err)
		var ee *exitError
		if errors.As(err, &ee) {
			return ee.code
		}
		return 1
	}
	return 0
}

func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("ferry "+name, flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	return fs
}

// need returns an error naming the missing flags.
func need(fs *flag.FlagSet, names ...string) error {
	for _, n := range names {
		if f := fs.Lookup(n); f != nil && f.Value.String() == "" {
			return &exitError{code: 2, err: fmt.Errorf("--%s is required", n)}
		}
	}
	return nil
}
