package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"

	"tine/guestagent/proto"
)

// PutFile writes r to path in the sandbox with mode's permission bits
// (and setuid, setgid, sticky). The file appears whole or not at all. The
// agent answers an End once the file is in place, or an Error; any other
// answer is an error.
func (c *Client) PutFile(ctx context.Context, path string, mode fs.FileMode, r io.Reader) error {
	_, err := c.upload(ctx, proto.KindPut, proto.PutRequest{Path: path, Mode: proto.ModeBits(mode)}, path, r)
	return err
}

// PutTree copies a tar stream of one file or directory tree (as
// internal/treecopy writes it) to path in the sandbox: into path when it
// is an existing directory, as path otherwise; into requires the
// directory. It returns where the copy landed, once every entry is in
// place.
func (c *Client) PutTree(ctx context.Context, path string, into bool, r io.Reader) (string, error) {
	end, err := c.upload(ctx, proto.KindPutTree, proto.PutTreeRequest{Path: path, Into: into}, path, r)
	if err != nil {
		return "", err
	}
	var res proto.PutTreeResult
	if err := proto.Decode(end, &res); err != nil {
		return "", fmt.Errorf("put %s: %w", path, err)
	}
	return res.Path, nil
}

// upload sends request req of kind k, then r's bytes in Data frames and
// End, and returns the agent's End. Before the data's end, the agent only
// answers to refuse it.
func (c *Client) upload(ctx context.Context, k proto.Kind, req any, path string, r io.Reader) (proto.Frame, error) {
	s, err := c.open(ctx, k, req)
	if err != nil {
		return proto.Frame{}, fmt.Errorf("put %s: %w", path, err)
	}
	defer c.forget(s)
	fail := func(err error) (proto.Frame, error) {
		c.sendBounded(proto.Frame{Kind: proto.KindCancel, ID: s.id})
		return proto.Frame{}, fmt.Errorf("put %s: %w", path, err)
	}
	buf := make([]byte, proto.ChunkSize)
	for {
		if ctx.Err() != nil {
			return fail(ctx.Err())
		}
		select {
		case f := <-s.ch:
			if f.Kind == proto.KindError {
				return proto.Frame{}, fmt.Errorf("put %s: %w", path, agentError(f))
			}
			return fail(fmt.Errorf("the agent answered %v before the data's end", f.Kind))
		default:
		}
		n, rerr := r.Read(buf)
		if n > 0 {
			if err := c.send(ctx, proto.Frame{Kind: proto.KindData, ID: s.id, Payload: buf[:n]}); err != nil {
				return proto.Frame{}, fmt.Errorf("put %s: %w", path, c.refusal(s, err))
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return fail(fmt.Errorf("read the source: %w", rerr))
		}
	}
	if err := c.send(ctx, proto.Frame{Kind: proto.KindEnd, ID: s.id}); err != nil {
		return proto.Frame{}, fmt.Errorf("put %s: %w", path, c.refusal(s, err))
	}
	f, err := c.recv(ctx, s)
	if err == nil && f.Kind != proto.KindEnd {
		err = fmt.Errorf("the agent answered %v, want end", f.Kind)
	}
	if err != nil {
		return proto.Frame{}, fmt.Errorf("put %s: %w", path, err)
	}
	return f, nil
}

// GetFile copies the regular file at path in the sandbox to w and returns
// its mode and size. It fails if the agent sends more or fewer bytes than
// the size it announced.
func (c *Client) GetFile(ctx context.Context, path string, w io.Writer) (proto.FileInfo, error) {
	s, err := c.open(ctx, proto.KindGet, proto.GetRequest{Path: path})
	if err != nil {
		return proto.FileInfo{}, fmt.Errorf("get %s: %w", path, err)
	}
	defer c.forget(s)
	var info proto.FileInfo
	got, started := int64(0), false
	for {
		f, err := c.recv(ctx, s)
		if err == nil {
			switch {
			case f.Kind == proto.KindFileInfo && !started:
				started = true
				if err = proto.Decode(f, &info); err == nil && info.Size < 0 {
					err = fmt.Errorf("the agent announced size %d", info.Size)
				}
			case f.Kind == proto.KindData && started:
				got += int64(len(f.Payload))
				if got > info.Size {
					// The file grew while it was read; what was announced is what is kept.
					err = fmt.Errorf("more than the announced %d bytes (the file changed while it was read)", info.Size)
				} else if _, werr := w.Write(f.Payload); werr != nil {
					err = fmt.Errorf("write the copy: %w", werr)
				}
			case f.Kind == proto.KindEnd && started:
				if got != info.Size {
					return info, fmt.Errorf("get %s: %d of the announced %d bytes (the file changed while it was read)", path, got, info.Size)
				}
				return info, nil
			default:
				err = errors.New("the agent's answer is out of order: " + f.Kind.String())
			}
		}
		if err != nil {
			c.sendBounded(proto.Frame{Kind: proto.KindCancel, ID: s.id})
			return info, fmt.Errorf("get %s: %w", path, err)
		}
	}
}

// GetTree copies the file, symlink or directory tree at path in the
// sandbox to w as a tar stream whose top entry is path's last element. An
// error after some bytes were written means the stream is cut: w holds no
// whole archive.
func (c *Client) GetTree(ctx context.Context, path string, w io.Writer) error {
	s, err := c.open(ctx, proto.KindGetTree, proto.GetTreeRequest{Path: path})
	if err != nil {
		return fmt.Errorf("get %s: %w", path, err)
	}
	defer c.forget(s)
	for {
		f, err := c.recv(ctx, s)
		if err == nil {
			switch f.Kind {
			case proto.KindData:
				if _, werr := w.Write(f.Payload); werr != nil {
					err = fmt.Errorf("write the copy: %w", werr)
				}
			case proto.KindEnd:
				return nil
			default:
				err = errors.New("the agent's answer is out of order: " + f.Kind.String())
			}
		}
		if err != nil {
			c.sendBounded(proto.Frame{Kind: proto.KindCancel, ID: s.id})
			return fmt.Errorf("get %s: %w", path, err)
		}
	}
}
