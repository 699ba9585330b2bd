package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"tine/api"
	"tine/api/client"
	"tine/sandbox"
)

// Messages between sandboxes, from the host's side: tine send and tine
// messages, and tine create's --message-to (docs/api.md, "Messages").

// messageCommands are the commands on sandboxes' inboxes.
func (a *app) messageCommands() []*cobra.Command {
	return []*cobra.Command{a.sendCommand(), a.messagesCommand()}
}

// messageToFlag binds tine create's --message-to.
func messageToFlag(f *pflag.FlagSet, p *string) {
	f.StringVar(p, "message-to", "", "which sandboxes it may message from inside: family (default: its parent, siblings and forks), none, or family,GLOB[,GLOB] (forks take their parent's)")
}

func (a *app) sendCommand() *cobra.Command {
	var raw bool
	c := &cobra.Command{
		Use:   "send SB MSG|-",
		Short: "send a message from the host to a sandbox's inbox (- reads it from stdin)",
		Long: `Send a message from the host to a sandbox's inbox: code inside reads it with
GET /v1/messages on /run/tine/api.sock. The message is the text MSG, or
standard input for -, sent as a JSON string; with --raw it is sent as the
JSON value it holds. It is on disk before tine send returns; its sender
is "host".`,
		Args: nArgs("SB", "MSG|-"),
		RunE: func(c *cobra.Command, args []string) error {
			name, text := args[0], args[1]
			if text == "-" {
				b, err := io.ReadAll(io.LimitReader(c.InOrStdin(), sandbox.MaxMessageBytes+1))
				if err != nil {
					return fmt.Errorf("read the message from stdin: %w", err)
				}
				text = string(b)
			}
			var body json.RawMessage
			if raw {
				if !json.Valid([]byte(text)) {
					return usageErr("--raw: the message is not one JSON value; leave out --raw to send it as text")
				}
				body = json.RawMessage(text)
			} else {
				b, err := json.Marshal(text)
				if err != nil {
					return err
				}
				body = b
			}
			ctx := c.Context()
			cl, err := a.daemon(ctx)
			if err != nil {
				return err
			}
			s, err := cl.Send(ctx, name, body)
			if err != nil {
				return messageErr(name, err)
			}
			if a.json {
				return writeJSON(a.stdout, s)
			}
			fmt.Fprintf(a.stdout, "%d\n", s.ID)
			fmt.Fprintf(a.stderr, "sent message %d to %s (%d bytes); it reads it with GET /v1/messages, you with \"tine messages %s\"\n", s.ID, s.To, s.Bytes, s.To)
			return nil
		},
	}
	c.Flags().BoolVar(&raw, "raw", false, "send MSG as the JSON value it holds (an object, a number...) instead of as text")
	return c
}

// messageErr words an error about sandbox name's inbox.
func messageErr(name string, err error) error {
	var ce *client.Error
	if errors.As(err, &ce) && ce.Code == "full" {
		return fmt.Errorf("%v; read them with \"tine messages %s --take\"", err, name)
	}
	return sbErr(name, err)
}

func (a *app) messagesCommand() *cobra.Command {
	var follow, take bool
	var after uint64
	c := &cobra.Command{
		Use:   "messages SB",
		Short: "show a sandbox's inbox: the messages sent to it, oldest first",
		Long: `Show the messages in a sandbox's inbox, oldest first: its id, time, sender
(a sandbox, or host) and body. --take removes those shown from the inbox;
-f keeps waiting for new ones until interrupted. With --json: a JSON array,
or with -f one JSON object a line.`,
		Args: nArgs("SB"),
		RunE: func(c *cobra.Command, args []string) error {
			name := args[0]
			ctx := c.Context()
			cl, err := a.daemon(ctx)
			if err != nil {
				return err
			}
			o := sandbox.ReadOptions{After: after, Take: take}
			if !follow {
				msgs, err := cl.Messages(ctx, name, o)
				if err != nil {
					return messageErr(name, err)
				}
				if a.json {
					return writeJSON(a.stdout, msgs)
				}
				if len(msgs) == 0 {
					fmt.Fprintf(a.stderr, "no messages for %s\n", name)
				}
				for _, m := range msgs {
					a.printMessage(m)
				}
				return nil
			}
			o.Wait = time.Minute
			for {
				msgs, err := cl.Messages(ctx, name, o)
				if ctx.Err() != nil {
					return nil
				}
				if err != nil {
					return messageErr(name, err)
				}
				for _, m := range msgs {
					if a.json {
						b, _ := json.Marshal(m)
						fmt.Fprintf(a.stdout, "%s\n", b)
					} else {
						a.printMessage(m)
					}
					o.After = max(o.After, m.ID)
				}
			}
		},
	}
	c.Flags().BoolVarP(&follow, "follow", "f", false, "keep waiting for new messages and print each as it comes")
	c.Flags().BoolVar(&take, "take", false, "remove the messages shown from the inbox")
	c.Flags().Uint64Var(&after, "after", 0, "show only messages with a higher id")
	return c
}

// printMessage prints one message on one line: a string body as its
// text, any other as JSON; control characters (a sandbox wrote them) are
// escaped, so that none reaches the terminal.
func (a *app) printMessage(m api.Message) {
	body := string(m.Body)
	var s string
	if json.Unmarshal(m.Body, &s) == nil {
		body = s
	}
	fmt.Fprintf(a.stdout, "%-5d %s  %-16s %s\n", m.ID, m.Time.Local().Format(time.DateTime), m.From, printable(body))
}

// messageToText says in words which sandboxes a policy lets a sandbox
// message.
func messageToText(p string) string {
	switch p {
	case "", "family":
		return "family (its parent, siblings and forks)"
	case "none":
		return "none"
	}
	return p + " (family: its parent, siblings and forks; globs: sandbox names)"
}
