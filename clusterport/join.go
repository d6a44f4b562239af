package clusterport

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/pinnedd/pinnedd/internal/clustertls"
)

// ErrUntrustedCA means a joining node refused the CA or certificate a
// member sent: it is not vouched for by this node's deployment token.
var ErrUntrustedCA = errors.New("untrusted cluster CA")

// CAAnswer is a member's cluster CA certificate and its pin under the
// deployment token; Pins, its pins under each of the member's join tokens
// (a node key being rotated: the joining node may hold the new value or
// the old).
type CAAnswer struct {
	CA   string   `json:"ca"`
	Pin  string   `json:"pin"`
	Pins []string `json:"pins,omitempty"`
}

// CertRequest asks a member to sign a joining node's certificate request.
type CertRequest struct {
	ID  string `json:"id"`
	CSR string `json:"csr"`
}

// CertAnswer is the signed certificate and the CA it chains to, PEM.
type CertAnswer struct {
	Cert string `json:"cert"`
	CA   string `json:"ca"`
}

// CheckPins: the CA is pinned under token, by its main pin or one of the
// others (a member whose node key is being rotated pins it under each
// value).
func CheckPins(token string, ca CAAnswer) error {
	err := clustertls.CheckPin(token, []byte(ca.CA), ca.Pin)
	for _, pin := range ca.Pins {
		if err == nil {
			break
		}
		err = clustertls.CheckPin(token, []byte(ca.CA), pin)
	}
	return err
}

// Member is a member's side of a join's certificate exchange, as the
// joining node calls it: its CA (asked without authorization), and a
// certificate request the deployment token proves without leaving this
// node (a join proof).
type Member interface {
	CA(ctx context.Context) (CAAnswer, error)
	Certificate(ctx context.Context, req CertRequest) (CertAnswer, error)
	String() string // for errors: where it is
}

// FetchIdentity gets this node's certificate from member: it fetches the
// CA and checks its pin under token before the token proves anything (so
// a CA substituted by someone in between is refused first), sends a
// certificate request for its key (made and stored in k if there is
// none), checks the certificate it gets, stores CA and certificate in k
// and sets id.
func FetchIdentity(ctx context.Context, k Keys, id *clustertls.Identity, nodeID string, hosts []string, token string, member Member) error {
	ca, err := member.CA(ctx)
	if err != nil {
		return fmt.Errorf("fetching the cluster CA: %w", err)
	}
	if err := CheckPins(token, ca); err != nil {
		return fmt.Errorf("%w: the CA from %s is not vouched for by this node's PINBOARD_TOKEN (another cluster, another token, or someone in between): %w", ErrUntrustedCA, member, err)
	}
	key, err := k.ReadKey(clustertls.KeyFile, clustertls.LabelNodeKey)
	if errors.Is(err, os.ErrNotExist) {
		if key, err = clustertls.NewKey(); err == nil {
			err = k.WriteKey(clustertls.KeyFile, clustertls.LabelNodeKey, key)
		}
	}
	if err != nil {
		return fmt.Errorf("node key: %w", err)
	}
	csr, err := clustertls.NewCSR(key, nodeID, hosts)
	if err != nil {
		return err
	}
	ans, err := member.Certificate(ctx, CertRequest{ID: nodeID, CSR: string(csr)})
	if err != nil {
		return fmt.Errorf("getting this node's certificate: %w", err)
	}
	if ans.CA != ca.CA {
		return fmt.Errorf("%w: %s answered the certificate request with another CA than the pinned one", ErrUntrustedCA, member)
	}
	// Set checks that the certificate chains to the pinned CA and fits this node's key.
	probe := &clustertls.Identity{}
	if err := probe.Set([]byte(ca.CA), []byte(ans.Cert), key); err != nil {
		return fmt.Errorf("%w: the certificate from %s: %w", ErrUntrustedCA, member, err)
	}
	if probe.NodeID() != nodeID {
		return fmt.Errorf("%w: %s issued a certificate for %q", ErrUntrustedCA, member, probe.NodeID())
	}
	if err := k.WriteFile(clustertls.CAFile, []byte(ca.CA)); err != nil {
		return err
	}
	if err := k.WriteFile(clustertls.CertFile, []byte(ans.Cert)); err != nil {
		return err
	}
	if err := id.Set([]byte(ca.CA), []byte(ans.Cert), key); err != nil {
		return err
	}
	k.Logger.Info("got this node's cluster certificate", "via", member.String(), "dir", k.Dir)
	return nil
}
