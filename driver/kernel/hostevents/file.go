package hostevents

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/fsnotify/fsnotify"
)

// FileSource reports changes of the file Path. It watches the directory,
// not the file: a ConfigMap volume replaces its files by swapping the
// "..data" symlink, so the file itself is never written, and an editor
// renames a new file over the old one. Only Path's own name and the
// kubelet's "..*" entries count: other files in the directory (a log
// written on every publish) must not cause rescans.
type FileSource struct{ Path string }

// Name implements Source.
func (s FileSource) Name() string { return "changes of " + s.Path }

// Run implements Source.
func (s FileSource) Run(ctx context.Context, out chan<- Event) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", s.Path, err)
	}
	defer w.Close()
	dir, base := filepath.Dir(s.Path), filepath.Base(s.Path)
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("watch directory %s of %s: %w", dir, s.Path, err)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return fmt.Errorf("watch of %s closed", dir)
			}
			if name := filepath.Base(ev.Name); name == base || strings.HasPrefix(name, "..") {
				send(ctx, out, Event{Kind: Config, Action: ev.Op.String(), Device: s.Path, Detail: name})
			}
		case err, ok := <-w.Errors:
			if !ok {
				return fmt.Errorf("watch of %s closed", dir)
			}
			send(ctx, out, Event{Kind: Lost, Device: s.Path, Detail: err.Error()})
		}
	}
}
