package testutil

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// Python is the interpreter Python plugins and the SDK's tests run with:
// the system's, whose modules come from Debian's packages (python3-grpcio,
// python3-protobuf, python3-uvicorn, python3-cryptography, python3-pytest),
// not a pyenv or virtualenv python3 that PATH may find first.
const Python = "/usr/bin/python3"

var (
	pythonOnce sync.Once
	pythonErr  error
)

// NeedPython fails t unless Python can import what the SDK and its tests
// need: a missing package is a broken machine (.ci/run installs them),
// never a reason to skip.
func NeedPython(t testing.TB) {
	t.Helper()
	pythonOnce.Do(func() {
		out, err := exec.Command(Python, "-c", "import grpc, google.protobuf, uvicorn, cryptography, pytest").CombinedOutput()
		if err != nil {
			pythonErr = fmt.Errorf("%s cannot import the Python SDK's dependencies (apt-get install python3-grpcio python3-protobuf python3-uvicorn python3-cryptography python3-pytest): %w\n%s", Python, err, out)
		}
	})
	if pythonErr != nil {
		t.Fatal(pythonErr)
	}
}

// PythonPlugin copies the Python SDK (sdk/python/src) and a Python host's
// directory (dir, relative to the module's root, e.g.
// "examples/python/counter") into a SharedDir, which a root pinnedd's
// plugin account can read, and returns the host's executable script
// (<base of dir>.py) and the PYTHONPATH under which it finds the SDK: pass
// it with --plugin-env /NS=PYTHONPATH=<path>.
func PythonPlugin(t testing.TB, dir string) (script, pythonPath string) {
	t.Helper()
	NeedPython(t)
	shared := SharedDir(t)
	root := moduleRoot()
	pythonPath = filepath.Join(shared, "lib")
	if err := copyTree(filepath.Join(root, "sdk", "python", "src"), pythonPath); err != nil {
		t.Fatal(err)
	}
	app := filepath.Join(shared, "app")
	if err := copyTree(filepath.Join(root, filepath.FromSlash(dir)), app); err != nil {
		t.Fatal(err)
	}
	script = filepath.Join(app, filepath.Base(dir)+".py")
	if err := os.Chmod(script, 0o755); err != nil {
		t.Fatal(err)
	}
	return script, pythonPath
}

// copyTree copies the regular files under src to dst, readable by every
// account (directories 0755, files 0644), leaving out __pycache__.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		out := filepath.Join(dst, rel)
		switch {
		case d.IsDir() && d.Name() == "__pycache__":
			return filepath.SkipDir
		case d.IsDir():
			if err := os.MkdirAll(out, 0o755); err != nil {
				return err
			}
			return os.Chmod(out, 0o755) // past the umask
		case !d.Type().IsRegular():
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if err := os.WriteFile(out, b, 0o644); err != nil {
			return err
		}
		return os.Chmod(out, 0o644)
	})
}
