package supervisor

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/user"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	goplugin "github.com/hashicorp/go-plugin"
	"golang.org/x/sys/unix"

	"github.com/pinnedd/pinnedd/internal/httpx"
	"github.com/pinnedd/pinnedd/plugins"
)

// Least privilege for plugin processes. A plugin is instance code: it gets
// what it needs to serve its namespaces and nothing that lets it act as the
// node.
//
//   - Its environment is built, never inherited (pluginEnv): the allow-list
//     plugins.AllowedEnv from pinnedd's own, the operator's Spec.Env, and
//     what pinnedd sets. No PINBOARD_*, DATABASE_URL or other secret.
//   - Each process gets two random secrets over the control channel
//     (DescribeRequest), never the environment: the data-socket secret,
//     which pinnedd puts on every request it writes to the socket
//     (pluginFields) so no other local process can drive an instance, and
//     the cluster-call credential, which the front door honours only for
//     the namespaces that process serves here, and only while it lives
//     (VerifyClusterCall).
//   - With a Spec.User (pinnedd as root), the process runs as that user,
//     its sockets and TMPDIR in a directory only that user (and pinnedd)
//     can enter (openRuntimeDir); pinnedd's data dir stays closed to it.

// ErrPluginEnv: an operator's plugin environment setting pinnedd refuses.
var ErrPluginEnv = errors.New("invalid plugin environment setting")

// newSecret returns 32 random bytes, hex-encoded.
func newSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails on Linux (getrandom)
	return hex.EncodeToString(b)
}

// pluginEnv is the whole environment of a plugin process: the allow-listed
// part of parent (pinnedd's own, os.Environ()), then the spec's Env minus
// any pinnedd secret, then what pinnedd sets itself (set), which wins.
// go-plugin appends its own cookie and PLUGIN_* settings (the client runs
// with SkipHostEnv, so it adds nothing of pinnedd's).
func pluginEnv(parent, specEnv, set []string) (env, dropped []string) {
	for _, kv := range parent {
		if name, _, _ := strings.Cut(kv, "="); plugins.Allowed(name) {
			env = append(env, kv)
		}
	}
	for _, kv := range specEnv {
		name, _, _ := strings.Cut(kv, "=")
		if plugins.SecretEnv(name) {
			dropped = append(dropped, name)
			continue
		}
		env = append(env, kv)
	}
	return append(env, set...), dropped
}

// PluginEnvSetting is one operator setting for plugins' environments:
// --plugin-env [/ns=]KEY or [/ns=]KEY=VALUE.
type PluginEnvSetting struct {
	// Namespace limits the setting to the plugin serving it; "" is every
	// plugin.
	Namespace string
	Key       string
	// Value to set; with Pass, pinnedd's own value of Key (the variable
	// is left out when pinnedd has none).
	Value string
	Pass  bool
}

// ParsePluginEnv parses one --plugin-env setting:
//
//	KEY             pass pinnedd's own KEY through to every plugin
//	KEY=VALUE       set KEY to VALUE for every plugin
//	/ns=KEY         pass KEY through to the plugin serving /ns only
//	/ns=KEY=VALUE   set KEY for the plugin serving /ns only
//
// It refuses pinnedd's secrets (PINBOARD_*, DATABASE_URL), what pinnedd and
// go-plugin set themselves (PINNEDD_*, PLUGIN_*) and the agent's own
// systemd variables, saying which and why.
func ParsePluginEnv(s string) (PluginEnvSetting, error) {
	var set PluginEnvSetting
	rest := s
	if strings.HasPrefix(s, "/") {
		ns, kv, ok := strings.Cut(s, "=")
		if !ok || kv == "" {
			return set, fmt.Errorf("%w %q: want /ns=KEY or /ns=KEY=VALUE", ErrPluginEnv, s)
		}
		if err := plugins.ValidateNamespace(ns); err != nil {
			return set, fmt.Errorf("%w %q: %w", ErrPluginEnv, s, err)
		}
		set.Namespace, rest = ns, kv
	}
	key, value, hasValue := strings.Cut(rest, "=")
	if !validEnvName(key) {
		return set, fmt.Errorf("%w %q: %q is not a variable name (letters, digits and _, not starting with a digit)", ErrPluginEnv, s, key)
	}
	if why := plugins.ReservedEnv(key); why != "" {
		return set, fmt.Errorf("%w %q: %s may not be passed to plugins (%s)", ErrPluginEnv, s, key, why)
	}
	set.Key, set.Value, set.Pass = key, value, !hasValue
	return set, nil
}

func validEnvName(s string) bool {
	if s == "" || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// ApplyPluginEnv adds the operator's settings to each spec's Env, in order
// (a later setting of the same key wins): a setting with a namespace goes to
// the spec serving it, and must name one of the specs' namespaces.
// lookup is pinnedd's own environment (os.LookupEnv) for pass-through
// settings.
func ApplyPluginEnv(specs []Spec, settings []PluginEnvSetting, lookup func(string) (string, bool)) error {
	for _, set := range settings {
		kv := set.Key + "=" + set.Value
		if set.Pass {
			v, ok := lookup(set.Key)
			if !ok {
				continue
			}
			kv = set.Key + "=" + v
		}
		found := set.Namespace == ""
		for i := range specs {
			if set.Namespace == "" || slices.Contains(specs[i].Namespaces, set.Namespace) {
				specs[i].Env = append(specs[i].Env, kv)
				found = true
			}
		}
		if !found {
			return fmt.Errorf("%w: --plugin-env %s=%s: no plugin serves %s on this node", ErrPluginEnv, set.Namespace, set.Key, set.Namespace)
		}
	}
	return nil
}

// pinnedEnv is what pinnedd sets for one plugin process whose sockets go
// to dir (socketDir).
func (p *pluginProc) pinnedEnv(socket, dir string) []string {
	s := p.sup
	env := []string{
		plugins.EnvDataSocket + "=" + socket,
		plugins.EnvParentPID + "=" + fmt.Sprint(os.Getpid()),
		plugins.EnvPluginName + "=" + p.spec.Name,
		// go-plugin's own sockets (control, broker) go beside the data
		// socket, where the next start sweeps them after a kill -9.
		goplugin.EnvUnixSocketDir + "=" + dir,
	}
	if u := p.spec.User; u != nil {
		// Its own home, and a temporary directory it can write: pinnedd's
		// TMPDIR may be closed to it.
		env = append(env, "HOME="+u.Home, "TMPDIR="+dir)
	}
	if s.cfg.FrontDoorURL != "" {
		env = append(env, plugins.EnvFrontDoor+"="+s.cfg.FrontDoorURL)
	}
	if len(s.cfg.FrontDoorCA) != 0 {
		env = append(env, plugins.EnvFrontDoorCA+"="+string(s.cfg.FrontDoorCA))
	}
	return env
}

// callCredentials maps live cluster-call credentials to the processes
// holding them. Keys are hashes: a lookup's timing says nothing about any
// credential's bytes.
type callCredentials struct {
	mu sync.RWMutex
	m  map[[sha256.Size]byte]*incarnation
}

func (c *callCredentials) add(token string, inc *incarnation) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[[sha256.Size]byte]*incarnation{}
	}
	c.m[sha256.Sum256([]byte(token))] = inc
}

func (c *callCredentials) remove(token string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, sha256.Sum256([]byte(token)))
}

func (c *callCredentials) get(token string) *incarnation {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.m[sha256.Sum256([]byte(token))]
}

// VerifyClusterCall reports which namespaces a cluster-call credential
// (the token part of plugins.ParseClusterCall) speaks for: those the plugin
// process it was given to serves on this node. ok is false for any other
// token, and for a process that has exited. The front door treats a request
// as a cluster call from namespace ns only when ok and ns is among them,
// and in hostname-aware mode pins its Host to hostname, the one the
// process serves: a preview build calls its own build's peers.
func (s *Supervisor) VerifyClusterCall(token string) (hostname string, namespaces []string, ok bool) {
	if token == "" {
		return "", nil, false
	}
	inc := s.calls.get(token)
	if inc == nil || !inc.alive() {
		return "", nil, false
	}
	p := inc.proc
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ns := range p.namespaces {
		if inc.hosts[ns] != nil {
			namespaces = append(namespaces, ns)
		}
	}
	return p.spec.Bind.Hostname, namespaces, true
}

// pluginFields are the fields every request written to a plugin's data
// socket carries for instance k: which instance, and the socket secret.
func pluginFields(inc *incarnation, k Key) []httpx.Field {
	return []httpx.Field{
		{Name: plugins.HeaderNamespace, Value: k.Namespace},
		{Name: plugins.HeaderID, Value: k.ID},
		{Name: plugins.HeaderSocketSecret, Value: inc.socketSecret},
	}
}

// ErrPluginUser: a --plugin-user setting pinnedd refuses.
var ErrPluginUser = errors.New("invalid plugin user")

// User is an account a plugin process runs as: its uid, primary gid,
// supplementary groups and home, looked up once at start (LookupUser).
// A plugin with a User gets a private socket directory of its own (see
// openRuntimeDir), TMPDIR and HOME in it and its home, and nothing of
// pinnedd's files: the data dir stays pinnedd's (0700).
type User struct {
	Name   string
	UID    uint32
	GID    uint32
	Groups []uint32
	Home   string
	// Default: pinnedd chose this account (WithDefaultPluginUser), no
	// --plugin-user did. Only what pinnedd says about it differs.
	Default bool
}

// about names u in a message: its name and uid, and why a plugin runs as it
// when pinnedd chose it.
func (u *User) about() string {
	if u.Default {
		return fmt.Sprintf("%s (uid %d; pinnedd's default account for plugins as root without --plugin-user)", u.Name, u.UID)
	}
	return fmt.Sprintf("%s (uid %d)", u.Name, u.UID)
}

// LookupUser finds the account a plugin is to run as. It refuses an
// unknown user and root (uid 0): a plugin as root would hold everything
// pinnedd holds.
func LookupUser(name string) (*User, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %w", ErrPluginUser, name, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("%w %q: uid %q: %w", ErrPluginUser, name, u.Uid, err)
	}
	if uid == 0 {
		return nil, fmt.Errorf("%w %q: it is root (uid 0); plugins run as root only without --plugin-user", ErrPluginUser, name)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("%w %q: gid %q: %w", ErrPluginUser, name, u.Gid, err)
	}
	ids, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("%w %q: groups: %w", ErrPluginUser, name, err)
	}
	out := &User{Name: u.Username, UID: uint32(uid), GID: uint32(gid), Home: u.HomeDir}
	for _, id := range ids {
		g, err := strconv.ParseUint(id, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%w %q: group %q: %w", ErrPluginUser, name, id, err)
		}
		if g == 0 {
			// Group root would reach what root's group may; refuse it as
			// root itself is refused.
			return nil, fmt.Errorf("%w %q: it is in group root (gid 0)", ErrPluginUser, name)
		}
		out.Groups = append(out.Groups, uint32(g))
	}
	if gid == 0 {
		return nil, fmt.Errorf("%w %q: its primary group is root (gid 0)", ErrPluginUser, name)
	}
	return out, nil
}

// ErrNeedsRoot: a plugin is to run as another user, and pinnedd cannot
// switch to it.
var ErrNeedsRoot = errors.New("needs pinnedd to run as root")

// switchCaps are the capabilities root needs to run plugins as other users
// and still reach them: set their uid and groups, hand them their socket
// directories, connect to and clean up the sockets they make, signal them.
var switchCaps = []struct {
	capability int
	name       string
}{
	{unix.CAP_SETUID, "CAP_SETUID"},
	{unix.CAP_SETGID, "CAP_SETGID"},
	{unix.CAP_CHOWN, "CAP_CHOWN"},
	{unix.CAP_DAC_OVERRIDE, "CAP_DAC_OVERRIDE"},
	{unix.CAP_KILL, "CAP_KILL"},
}

// SwitchCapabilities names the capabilities CheckCanSwitchUser wants (the
// shipped systemd unit's CapabilityBoundingSet=).
func SwitchCapabilities() []string {
	var out []string
	for _, c := range switchCaps {
		out = append(out, c.name)
	}
	return out
}

// CheckCanSwitchUser says whether this process can start plugins as other
// users: it must be root, with the capabilities in switchCaps (a systemd
// unit may have taken them away).
func CheckCanSwitchUser() error {
	if os.Geteuid() != 0 {
		return ErrNeedsRoot
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("read capabilities: %w", err)
	}
	var missing []string
	for _, c := range switchCaps {
		if data[c.capability/32].Effective&(1<<(c.capability%32)) == 0 {
			missing = append(missing, c.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w with %s (missing; under systemd, CapabilityBoundingSet=)", ErrNeedsRoot, strings.Join(missing, " "))
	}
	return nil
}

// PluginUserSetting is one --plugin-user setting: [/ns=]NAME.
type PluginUserSetting struct {
	// Namespace limits the setting to the plugin serving it; "" is every
	// plugin without a setting of its own.
	Namespace string
	User      *User
}

// ParsePluginUser parses and looks up one --plugin-user setting:
//
//	NAME       every plugin runs as NAME (unless /ns=NAME says otherwise)
//	/ns=NAME   the plugin serving /ns runs as NAME
func ParsePluginUser(s string) (PluginUserSetting, error) {
	var set PluginUserSetting
	name := s
	if strings.HasPrefix(s, "/") {
		ns, n, ok := strings.Cut(s, "=")
		if !ok || n == "" {
			return set, fmt.Errorf("%w %q: want NAME or /ns=NAME", ErrPluginUser, s)
		}
		if err := plugins.ValidateNamespace(ns); err != nil {
			return set, fmt.Errorf("%w %q: %w", ErrPluginUser, s, err)
		}
		set.Namespace, name = ns, n
	}
	if name == "" {
		return set, fmt.Errorf("%w: empty user name", ErrPluginUser)
	}
	u, err := LookupUser(name)
	if err != nil {
		return set, err
	}
	set.User = u
	return set, nil
}

// The accounts a root pinnedd runs plugins as when no --plugin-user setting
// names one for them. A plugin as root would hold everything pinnedd holds,
// so root is never the default: DefaultPluginUserName when the machine has
// it (systemd/pinnedd.sysusers makes it), else SharedPluginUserName, which
// other daemons may run as too (the agent warns at start).
const (
	DefaultPluginUserName = "pinnedd-plugin"
	SharedPluginUserName  = "nobody"
)

// WithDefaultPluginUser adds pinnedd's default user to settings when
// pinnedd runs as root (euid 0) and none of them is a default of the
// operator's (a setting without a namespace): the plugins no setting names
// then run as DefaultPluginUserName, or SharedPluginUserName on a machine
// without it. It is a setting like any --plugin-user one, looked up and
// refused by LookupUser and applied by ApplyPluginUsers: one path for
// both. Not root, pinnedd cannot switch users: settings come back as they
// are, and its plugins share its user.
func WithDefaultPluginUser(settings []PluginUserSetting, euid int) ([]PluginUserSetting, error) {
	return withDefaultPluginUser(settings, euid, LookupUser)
}

func withDefaultPluginUser(settings []PluginUserSetting, euid int, lookup func(string) (*User, error)) ([]PluginUserSetting, error) {
	if euid != 0 || slices.ContainsFunc(settings, func(s PluginUserSetting) bool { return s.Namespace == "" }) {
		return settings, nil
	}
	u, err := lookup(DefaultPluginUserName)
	var unknown user.UnknownUserError
	if errors.As(err, &unknown) {
		// Only a missing account falls back: one that exists and is
		// refused (root's uid, group root) is an error to fix.
		u, err = lookup(SharedPluginUserName)
	}
	if err != nil {
		return nil, fmt.Errorf("no account for plugins (pinnedd runs as root without --plugin-user): %w; create %s (systemd/pinnedd.sysusers) or give --plugin-user NAME", err, DefaultPluginUserName)
	}
	u.Default = true
	return append(slices.Clone(settings), PluginUserSetting{User: u}), nil
}

// ErrPluginBinary: a plugin's binary the account it runs as cannot execute.
var ErrPluginBinary = errors.New("plugin binary not executable by its user")

// CheckExecutable says whether the account sp's plugin runs as can execute
// its binary, so that pinnedd can refuse at start, saying what to do,
// rather than fail at exec. A spec without a User runs as pinnedd, which
// found the binary executable (--plugin): nothing to check.
//
// The kernel answers, for that account: faccessat2(AT_EACCESS) on a thread
// that takes the account's file-system uid, gid and groups for the check
// (setfsuid leaves the process's other ids alone), so every directory on
// the path, ACLs, symlinks and noexec mounts count as they will at exec.
// The kernel makes the process non-dumpable as its fsuid changes; pinnedd
// already is (harden.NonDumpable). A kernel (or seccomp filter) without
// faccessat2 cannot say: the check passes, and exec decides as before.
func (sp *Spec) CheckExecutable() error {
	u := sp.User
	if u == nil {
		return nil
	}
	errc := make(chan error, 1)
	go func() {
		// No other goroutine may run on this thread while it has the
		// account's ids. Once accessAs put pinnedd's back, the thread is
		// let go: ending it would kill every plugin process it forked
		// earlier (their death signal follows the forking thread). Only a
		// thread whose ids could not be put back stays locked, so the
		// runtime ends it when this goroutine returns (or parks it for
		// good if it is the main thread).
		runtime.LockOSThread()
		err := accessAs(u, sp.Path)
		if !errors.Is(err, errSwitchFS) {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	err := <-errc
	switch {
	case errors.Is(err, errSwitchFS):
		return fmt.Errorf("plugin %s: check that %s can execute %s: %w", sp.Name, u.Name, sp.Path, err)
	case err == nil, errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EPERM):
		return nil
	}
	return fmt.Errorf("%w: plugin %s runs as %s, which cannot execute %s (%w); make the binary and every directory above it executable by that account (install it root-owned, mode 0755, e.g. in /opt/pinned), or run the plugin as another account with --plugin-user",
		ErrPluginBinary, sp.Name, u.about(), sp.Path, err)
}

// errSwitchFS: the checking thread could not take the account's ids.
var errSwitchFS = errors.New("take the account's file-system ids")

// accessAs asks the kernel whether u can execute path, with the calling
// thread's file-system ids and groups set to u's for the call and put back
// after it. The caller's thread must be locked, and stay locked if an
// errSwitchFS comes back (its ids may not be pinnedd's).
func accessAs(u *User, path string) (err error) {
	// unix's calls are the raw, per-thread syscalls (syscall's Setgroups
	// would change every thread of pinnedd).
	own, err := unix.Getgroups()
	if err != nil {
		return fmt.Errorf("%w: getgroups: %w", errSwitchFS, err)
	}
	groups := make([]int, len(u.Groups))
	for i, g := range u.Groups {
		groups[i] = int(g)
	}
	if err := unix.Setgroups(groups); err != nil {
		return fmt.Errorf("%w: setgroups: %w", errSwitchFS, err)
	}
	// setfsuid and setfsgid say nothing on failure: each returns the
	// previous value, so setting the same again reads the current one.
	ownGID, _ := unix.SetfsgidRetGid(int(u.GID))
	ownUID, _ := unix.SetfsuidRetUid(int(u.UID))
	defer func() {
		// Back to pinnedd's (root's fsuid gives back the file-system
		// capabilities the kernel took away with the change), then read.
		_, _ = unix.SetfsuidRetUid(ownUID)
		_, _ = unix.SetfsgidRetGid(ownGID)
		uid, _ := unix.SetfsuidRetUid(ownUID)
		gid, _ := unix.SetfsgidRetGid(ownGID)
		if gerr := unix.Setgroups(own); gerr != nil || uid != ownUID || gid != ownGID {
			// The thread stays locked, and ends or parks: nothing runs
			// with these ids. Said all the same.
			err = errors.Join(err, fmt.Errorf("%w: put pinnedd's back: fsuid %d, fsgid %d: %v", errSwitchFS, uid, gid, gerr))
		}
	}()
	if uid, _ := unix.SetfsuidRetUid(int(u.UID)); uid != int(u.UID) {
		return fmt.Errorf("%w: fsuid is %d", errSwitchFS, uid)
	}
	if gid, _ := unix.SetfsgidRetGid(int(u.GID)); gid != int(u.GID) {
		return fmt.Errorf("%w: fsgid is %d", errSwitchFS, gid)
	}
	return unix.Faccessat2(unix.AT_FDCWD, path, unix.X_OK, unix.AT_EACCESS)
}

// ApplyPluginUsers sets each spec's User: the setting naming one of its
// namespaces, else the one without a namespace (the default). Two settings
// for one namespace, a namespace no spec serves, and different users for
// namespaces of the same binary are refused.
func ApplyPluginUsers(specs []Spec, settings []PluginUserSetting) error {
	if len(settings) == 0 {
		return nil
	}
	var def *User
	byNS := map[string]*User{}
	for _, set := range settings {
		if set.Namespace == "" {
			if def != nil {
				return fmt.Errorf("%w: two default users (%s and %s)", ErrPluginUser, def.Name, set.User.Name)
			}
			def = set.User
			continue
		}
		if prev := byNS[set.Namespace]; prev != nil {
			return fmt.Errorf("%w: two users for %s (%s and %s)", ErrPluginUser, set.Namespace, prev.Name, set.User.Name)
		}
		byNS[set.Namespace] = set.User
	}
	used := map[string]bool{}
	for i := range specs {
		var u *User
		for _, ns := range specs[i].Namespaces {
			v := byNS[ns]
			if v == nil {
				continue
			}
			used[ns] = true
			if u != nil && u.Name != v.Name {
				return fmt.Errorf("%w: %s and %s are served by one process (%s), which cannot run as both %s and %s",
					ErrPluginUser, specs[i].Namespaces[0], ns, specs[i].Name, u.Name, v.Name)
			}
			u = v
		}
		if u == nil {
			u = def
		}
		specs[i].User = u
	}
	for ns := range byNS {
		if !used[ns] {
			return fmt.Errorf("%w: --plugin-user %s=%s: no plugin serves %s on this node", ErrPluginUser, ns, byNS[ns].Name, ns)
		}
	}
	return nil
}

// credential is what the plugin process of spec runs as: nil keeps
// pinnedd's own.
func (sp *Spec) credential() *syscall.Credential {
	if sp.User == nil {
		return nil
	}
	return &syscall.Credential{Uid: sp.User.UID, Gid: sp.User.GID, Groups: sp.User.Groups}
}
