package supervisor

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/pinnedd/pinnedd/internal/httpx"
	"os"
	"slices"
	"strings"
	"sync"

	goplugin "github.com/hashicorp/go-plugin"

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

// pinnedEnv is what pinnedd sets for one plugin process.
func (p *pluginProc) pinnedEnv(socket string) []string {
	s := p.sup
	env := []string{
		plugins.EnvDataSocket + "=" + socket,
		plugins.EnvParentPID + "=" + fmt.Sprint(os.Getpid()),
		plugins.EnvPluginName + "=" + p.spec.Name,
		// go-plugin's own sockets (control, broker) go beside the data
		// socket, where the next start sweeps them after a kill -9.
		goplugin.EnvUnixSocketDir + "=" + s.runtimeDir,
	}
	if s.cfg.FrontDoorURL != "" {
		env = append(env, plugins.EnvFrontDoor+"="+s.cfg.FrontDoorURL)
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
// as a cluster call from namespace ns only when ok and ns is among them.
func (s *Supervisor) VerifyClusterCall(token string) (namespaces []string, ok bool) {
	if token == "" {
		return nil, false
	}
	inc := s.calls.get(token)
	if inc == nil || !inc.alive() {
		return nil, false
	}
	p := inc.proc
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ns := range p.namespaces {
		if inc.hosts[ns] != nil {
			namespaces = append(namespaces, ns)
		}
	}
	return namespaces, true
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
