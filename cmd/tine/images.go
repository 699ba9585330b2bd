package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"tine/api"
	"tine/api/client"
	"tine/sandbox"
)

// imageCommand is "tine image": OCI images that sandboxes run over
// (docs/images.md).
func (a *app) imageCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "image",
		Short: "pull, import, list and remove OCI images that sandboxes run over (tine create --image)",
	}
	c.AddCommand(a.imagePullCommand(), a.imageImportCommand(), a.imageLsCommand(), a.imageRmCommand())
	return c
}

// imgErr turns an API error about image ref into one that names it and
// says what to do.
func imgErr(ref string, err error) error {
	var ce *client.Error
	if errors.As(err, &ce) {
		switch ce.Code {
		case "not_found":
			return fmt.Errorf("image %q not found; list images with \"tine image ls\", add one with \"tine image pull\" or \"tine image import\"", ref)
		case "not_implemented":
			return fmt.Errorf("image %s: %s; restart it with a tine that keeps images", ref, ce.Message)
		}
	}
	return apiError(err)
}

// printImage writes what was pulled or imported.
func (a *app) printImage(verb string, im *api.Image) error {
	if a.json {
		return writeJSON(a.stdout, im)
	}
	fmt.Fprintln(a.stdout, im.Digest)
	names := strings.Join(im.Names, ", ")
	if names == "" {
		names = "(no name)"
	}
	fmt.Fprintf(a.stderr, "%s image %s: %d layers, %s in %d entries; run a sandbox over it with \"tine create --image %s\"\n",
		verb, names, im.Layers, humanBytes(im.Stats.Bytes), im.Stats.Entries, firstName(im))
	return nil
}

func firstName(im *api.Image) string {
	if len(im.Names) > 0 {
		return im.Names[0]
	}
	return im.Digest
}

func (a *app) imagePullCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "pull REF",
		Short: "pull an image from its registry ([REGISTRY/]REPOSITORY[:TAG|@DIGEST]; credentials from docker login)",
		Args:  nArgs("REF"),
		RunE: func(c *cobra.Command, args []string) error {
			cl, err := a.daemon(c.Context())
			if err != nil {
				return err
			}
			im, err := cl.PullImage(c.Context(), api.PullRequest{Ref: args[0]})
			if err != nil {
				return imgErr(args[0], err)
			}
			return a.printImage("pulled", im)
		},
	}
}

func (a *app) imageImportCommand() *cobra.Command {
	var name string
	c := &cobra.Command{
		Use:   "import FILE|DIR",
		Short: "import an image from a docker save tarball or an OCI image layout directory (no network)",
		Args:  nArgs("FILE|DIR"),
		RunE: func(c *cobra.Command, args []string) error {
			p, err := filepath.Abs(args[0])
			if err != nil {
				return err
			}
			if _, err := os.Stat(p); err != nil {
				return usageErr("import %s: %v (give a docker save tarball or an OCI image layout directory)", args[0], err)
			}
			cl, err := a.daemon(c.Context())
			if err != nil {
				return err
			}
			im, err := cl.ImportImage(c.Context(), api.ImportRequest{Path: p, Name: name})
			if err != nil {
				return imgErr(args[0], err)
			}
			return a.printImage("imported", im)
		},
	}
	c.Flags().StringVar(&name, "name", "", "name for the image (default: the tarball's tag or the layout's ref.name); picks the image when the input holds several")
	return c
}

func (a *app) imageLsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "list the images in the daemon's store",
		Args:  nArgs(),
		RunE: func(c *cobra.Command, args []string) error {
			cl, err := a.daemon(c.Context())
			if err != nil {
				return err
			}
			list, err := cl.Images(c.Context())
			if err != nil {
				return imgErr("", err)
			}
			if a.json {
				return writeJSON(a.stdout, list)
			}
			return table(a.stdout, "NAME\tDIGEST\tLAYERS\tSIZE\tADDED", func(w io.Writer) {
				for _, im := range list {
					names := im.Names
					if len(names) == 0 {
						names = []string{"<none>"}
					}
					for _, n := range names {
						fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\n", n, short(strings.TrimPrefix(im.Digest, "sha256:")),
							im.Layers, humanBytes(im.Stats.Bytes), im.Added.Local().Format(time.DateTime))
					}
				}
			})
		},
	}
}

func (a *app) imageRmCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "rm REF",
		Short: "remove an image's name, and the image with its last name or when named by digest",
		Args:  nArgs("REF"),
		RunE: func(c *cobra.Command, args []string) error {
			cl, err := a.daemon(c.Context())
			if err != nil {
				return err
			}
			out, err := cl.RemoveImage(c.Context(), args[0])
			if err != nil {
				var ce *client.Error
				if errors.As(err, &ce) && ce.Code == "conflict" {
					return errors.New(ce.Message)
				}
				return imgErr(args[0], err)
			}
			if a.json {
				return writeJSON(a.stdout, out)
			}
			if out.Removed {
				fmt.Fprintf(a.stderr, "removed image %s (%s)\n", args[0], out.Digest)
			} else {
				fmt.Fprintf(a.stderr, "removed the name %s; image %s keeps its other names\n", args[0], out.Digest)
			}
			return nil
		},
	}
}

// imageLine is the status line of a sandbox's image.
func imageLine(im *sandbox.Image) string {
	s := im.Ref + " (" + short(strings.TrimPrefix(im.Digest, "sha256:")) + ")"
	if im.User != "" {
		s += ", user " + im.User
	}
	return s
}

// isNotFound says whether err is the API's not_found.
func isNotFound(err error) bool {
	var ce *client.Error
	return errors.As(err, &ce) && ce.Code == "not_found"
}
