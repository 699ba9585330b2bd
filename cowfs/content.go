package cowfs

import (
	"context"
	"io"
)

// OpenFileData streams the content of a file entry of a snapshot (a
// symlink's target for a symlink), holding one chunk at a time, for
// copies out of the store that must not read a whole file into memory.
func (f *FS) OpenFileData(ctx context.Context, e *Entry) (io.Reader, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return f.contentReader(e)
}
