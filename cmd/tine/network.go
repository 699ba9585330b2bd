package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"tine/api"
	"tine/guestagent/proto"
	"tine/sandbox"
)

// policyCommands are the commands on sandboxes' network, ports and
// secrets.
func (a *app) policyCommands() []*cobra.Command {
	return []*cobra.Command{a.networkCommand(), a.exposeCommand(), a.secretCommand()}
}

// createPolicyFlags are tine create's network, secret and port flags.
type createPolicyFlags struct {
	mode    string
	allow   []string
	secrets []string
	auto    bool
}

func (p *createPolicyFlags) flags(f *pflag.FlagSet) {
	f.StringVar(&p.mode, "network", "", "network mode: none (default: loopback only), allow (the --allow list only) or open (any IPv4 address, no checks)")
	f.StringArrayVar(&p.allow, "allow", nil, "allowed destination: NAME, *.NAME, IP or CIDR, each with an optional :PORT or :LO-HI (repeatable; implies --network allow)")
	f.StringArrayVar(&p.secrets, "secret", nil, "bind a stored secret: NAME=HOST:header:HEADER[:PREFIX], e.g. GITHUB_TOKEN=api.github.com:header:Authorization:Bearer (repeatable)")
	f.BoolVar(&p.auto, "auto-expose", false, "forward a host port (127.0.0.1) to every new listener of the sandbox")
}

// apply puts the flags in a create request.
func (p *createPolicyFlags) apply(req *api.CreateRequest, stderr io.Writer) error {
	mode := p.mode
	if mode == "" && len(p.allow) > 0 {
		mode = "allow"
	}
	if mode != "" {
		req.Network = &api.NetworkRequest{Mode: mode, Allow: p.allow}
	}
	if mode == "open" {
		fmt.Fprintln(stderr, "tine: network mode open: the sandbox may reach any IPv4 address, with no name checks")
	}
	for _, s := range p.secrets {
		b, err := sandbox.ParseSecretBinding(s)
		if err != nil {
			return usageErr("--secret: %v", err)
		}
		req.Secrets = append(req.Secrets, b)
	}
	req.AutoExpose = p.auto
	return nil
}

func (a *app) networkCommand() *cobra.Command {
	var set string
	var allow, deny []string
	c := &cobra.Command{
		Use:   "network SB",
		Short: "show or change the sandbox's network policy (at once when it runs)",
		Long: "Without flags, network prints the policy and, when the sandbox runs, its addresses\n" +
			"and the destinations denied since the last look. --set MODE replaces the policy\n" +
			"(with the --allow list for mode allow); without --set, --allow adds entries and\n" +
			"--deny removes them. Connections the new policy does not allow are cut.",
		Args: nArgs("SB"),
		RunE: func(c *cobra.Command, args []string) error {
			cl, err := a.daemon(c.Context())
			if err != nil {
				return err
			}
			var st *api.Network
			switch {
			case set != "":
				if len(deny) > 0 {
					return usageErr("--deny goes without --set (--set replaces the whole list)")
				}
				st, err = cl.SetNetwork(c.Context(), args[0], api.NetworkRequest{Mode: set, Allow: allow})
			case len(allow)+len(deny) > 0:
				st, err = cl.SetNetwork(c.Context(), args[0], api.NetworkRequest{Add: allow, Remove: deny})
			default:
				st, err = cl.Network(c.Context(), args[0])
			}
			if err != nil {
				return sbErr(args[0], err)
			}
			if a.json {
				return writeJSON(a.stdout, st)
			}
			if set == "open" {
				fmt.Fprintln(a.stderr, "tine: network mode open: the sandbox may reach any IPv4 address, with no name checks")
			}
			printNetwork(a.stdout, st)
			return nil
		},
	}
	c.Flags().StringVar(&set, "set", "", "replace the policy: none, allow (with --allow) or open")
	c.Flags().StringArrayVar(&allow, "allow", nil, "destination to allow (repeatable): NAME, *.NAME, IP or CIDR, with an optional :PORT or :LO-HI")
	c.Flags().StringArrayVar(&deny, "deny", nil, "entry to remove from the allow-list (repeatable)")
	return c
}

func printNetwork(w io.Writer, st *api.Network) {
	fmt.Fprintf(w, "mode     %s\n", st.Policy.GetMode())
	for _, e := range st.Policy.Allow {
		fmt.Fprintf(w, "allow    %s\n", e)
	}
	if st.Gateway != "" {
		fmt.Fprintf(w, "address  %s (gateway and resolver %s)\n", st.Address, st.Gateway)
	}
	for d, n := range st.Denied {
		fmt.Fprintf(w, "denied   %s (%d)\n", d, n)
	}
}

func (a *app) exposeCommand() *cobra.Command {
	var req api.ExposeRequest
	var rm bool
	var auto string
	c := &cobra.Command{
		Use:   "expose SB [PORT]",
		Short: "forward a host port (127.0.0.1 by default) to a port of the running sandbox",
		Long: "expose forwards a host port to PORT in the sandbox while it runs, and prints the URL\n" +
			"to open. --rm closes the exposure; --auto on exposes every new listener (kept\n" +
			"across restarts), --auto off stops doing so. \"tine ports SB\" lists both.",
		Args: func(c *cobra.Command, args []string) error {
			if auto != "" && len(args) == 1 || auto == "" && len(args) == 2 {
				return nil
			}
			return usageErr("want SB PORT, or SB with --auto on|off")
		},
		RunE: func(c *cobra.Command, args []string) error {
			cl, err := a.daemon(c.Context())
			if err != nil {
				return err
			}
			if auto != "" {
				if auto != "on" && auto != "off" {
					return usageErr("--auto %q: want on or off", auto)
				}
				if err := cl.SetAutoExpose(c.Context(), args[0], auto == "on"); err != nil {
					return sbErr(args[0], err)
				}
				if a.json {
					return writeJSON(a.stdout, map[string]bool{"auto": auto == "on"})
				}
				fmt.Fprintf(a.stderr, "auto-expose %s for sandbox %s\n", auto, args[0])
				return nil
			}
			port, err := strconv.Atoi(args[1])
			if err != nil || port < 1 || port > 65535 {
				return usageErr("PORT %q: want 1-65535", args[1])
			}
			if rm {
				if err := cl.Unexpose(c.Context(), args[0], port); err != nil {
					return sbErr(args[0], err)
				}
				if a.json {
					return writeJSON(a.stdout, map[string]int{"removed": port})
				}
				return nil
			}
			req.Port = port
			ex, err := cl.Expose(c.Context(), args[0], req)
			if err != nil {
				return sbErr(args[0], err)
			}
			if a.json {
				return writeJSON(a.stdout, ex)
			}
			fmt.Fprintln(a.stdout, ex.URL)
			fmt.Fprintf(a.stderr, "port %d of sandbox %s is at %s while it runs\n", ex.Port, args[0], ex.URL)
			return nil
		},
	}
	c.Flags().IntVar(&req.HostPort, "host-port", 0, "host port (default: the same when free, otherwise any)")
	c.Flags().StringVar(&req.HostAddress, "address", "127.0.0.1", "host address to listen on (0.0.0.0: every interface)")
	c.Flags().BoolVar(&rm, "rm", false, "close the exposure of PORT")
	c.Flags().StringVar(&auto, "auto", "", "on: expose every new listener; off: stop")
	return c
}

// portsView is what "tine ports --json" prints.
type portsView struct {
	Listeners  []proto.Port       `json:"listeners"`
	Exposures  []sandbox.Exposure `json:"exposures"`
	AutoExpose bool               `json:"auto_expose"`
}

func (a *app) portsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "ports SB",
		Short: "list the sandbox's listening sockets and its exposed ports, with URLs",
		Args:  nArgs("SB"),
		RunE: func(c *cobra.Command, args []string) error {
			cl, err := a.daemon(c.Context())
			if err != nil {
				return err
			}
			ports, err := cl.Ports(c.Context(), args[0])
			if err != nil {
				return sbErr(args[0], err)
			}
			ex, err := cl.Exposures(c.Context(), args[0])
			if err != nil {
				return sbErr(args[0], err)
			}
			if ports == nil {
				ports = []proto.Port{}
			}
			if a.json {
				return writeJSON(a.stdout, portsView{Listeners: ports, Exposures: ex.Exposures, AutoExpose: ex.Auto})
			}
			byPort := map[int]sandbox.Exposure{}
			for _, e := range ex.Exposures {
				byPort[e.Port] = e
			}
			err = table(a.stdout, "PROTO\tADDRESS\tPORT\tPID\tURL", func(w io.Writer) {
				for _, p := range ports {
					url := "-"
					if e, ok := byPort[int(p.Port)]; ok && strings.HasPrefix(p.Proto, "tcp") {
						url = e.URL
						delete(byPort, e.Port)
					}
					io.WriteString(w, portRow(p, url))
				}
				for _, e := range ex.Exposures {
					if _, ok := byPort[e.Port]; ok {
						fmt.Fprintf(w, "tcp\t(not listening)\t%d\t-\t%s\n", e.Port, e.URL)
					}
				}
			})
			if err == nil && len(ex.Exposures) == 0 && len(ports) > 0 {
				fmt.Fprintf(a.stderr, "open one in a browser with \"tine expose %s PORT\"\n", args[0])
			}
			return err
		},
	}
}

func (a *app) secretCommand() *cobra.Command {
	g := group("secret", "store credentials in the daemon; sandboxes see placeholders, the gateway sends the value")
	var fromEnv, fromFile string
	set := &cobra.Command{
		Use:   "set NAME",
		Short: "store a secret from an environment variable or a file (not from the command line)",
		Args:  nArgs("NAME"),
		RunE: func(c *cobra.Command, args []string) error {
			var v []byte
			switch {
			case (fromEnv == "") == (fromFile == ""):
				return usageErr("give one of --from-env VAR and --from-file FILE")
			case fromEnv != "":
				s, ok := os.LookupEnv(fromEnv)
				if !ok {
					return usageErr("--from-env %s: the variable is not set", fromEnv)
				}
				v = []byte(s)
			default:
				b, err := readLimited(fromFile, sandbox.MaxSecretBytes+2)
				if err != nil {
					return fmt.Errorf("--from-file: %w", err)
				}
				v = []byte(strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r"))
			}
			if err := sandbox.CheckSecretValue(args[0], v); err != nil {
				return usageErr("%v", err)
			}
			cl, err := a.daemon(c.Context())
			if err != nil {
				return err
			}
			if err := cl.SetSecret(c.Context(), args[0], v); err != nil {
				return apiError(err)
			}
			if a.json {
				return writeJSON(a.stdout, map[string]any{"name": args[0], "size": len(v)})
			}
			fmt.Fprintf(a.stderr, "stored secret %s (%d bytes); bind it with \"tine create --secret %s=HOST:header:Authorization:Bearer\"\n", args[0], len(v), args[0])
			return nil
		},
	}
	set.Flags().StringVar(&fromEnv, "from-env", "", "read the value from this environment variable")
	set.Flags().StringVar(&fromFile, "from-file", "", "read the value from this file (one trailing newline is dropped)")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "list the stored secrets (names and sizes, never values)",
		Args:  nArgs(),
		RunE: func(c *cobra.Command, args []string) error {
			cl, err := a.daemon(c.Context())
			if err != nil {
				return err
			}
			list, err := cl.Secrets(c.Context())
			if err != nil {
				return apiError(err)
			}
			if a.json {
				if list == nil {
					list = []sandbox.SecretInfo{}
				}
				return writeJSON(a.stdout, list)
			}
			return table(a.stdout, "NAME\tBYTES\tUPDATED", func(w io.Writer) {
				for _, s := range list {
					fmt.Fprintf(w, "%s\t%d\t%s\n", s.Name, s.Size, s.Updated.Local().Format(time.DateTime))
				}
			})
		},
	}
	rm := &cobra.Command{
		Use:   "rm NAME",
		Short: "delete a secret; sandboxes bound to it stop getting it",
		Args:  nArgs("NAME"),
		RunE: func(c *cobra.Command, args []string) error {
			cl, err := a.daemon(c.Context())
			if err != nil {
				return err
			}
			if err := cl.RemoveSecret(c.Context(), args[0]); err != nil {
				return fmt.Errorf("%w; list secrets with \"tine secret ls\"", apiError(err))
			}
			return nil
		},
	}
	g.AddCommand(set, ls, rm)
	return g
}

func readLimited(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, n))
}

// logAuditor writes audit records as JSON lines to the daemon's log.
type logAuditor struct {
	mu sync.Mutex
	w  io.Writer
}

// Append writes one record.
func (l *logAuditor) Append(kind string, fields map[string]any) error {
	b, err := json.Marshal(map[string]any{"time": time.Now().UTC().Format(time.RFC3339Nano), "kind": kind, "fields": fields})
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err = fmt.Fprintf(l.w, "tine serve: audit %s\n", b)
	return err
}

// portRow is one line of tine ports. The protocol and address are the
// agent's, which the sandbox may have forged: shown escaped where unsafe.
func portRow(p proto.Port, url string) string {
	return fmt.Sprintf("%s\t%s\t%d\t%d\t%s\n", shown(p.Proto), shown(p.Address), p.Port, p.PID, url)
}
