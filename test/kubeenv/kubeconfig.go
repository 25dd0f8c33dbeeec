package kubeenv

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/berthfleet/berth/test/pki"
)

// Client rates for test clients: high enough that client-side throttling never shapes a
// test, since the clusters serve nothing else.
const (
	clientQPS   = 100
	clientBurst = 200
)

// kubeconfig returns a kubeconfig for the cluster named name at server, whose single
// context is also named name.
func kubeconfig(name, server string, ca []byte, user string, creds pki.KeyPair) *clientcmdapi.Config {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: creds.Cert, ClientKeyData: creds.Key}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: user}
	cfg.CurrentContext = name
	return cfg
}

// impersonating returns a copy of cfg whose current context acts as user with groups.
func impersonating(cfg *clientcmdapi.Config, user string, groups []string) (*clientcmdapi.Config, error) {
	out := cfg.DeepCopy()
	ctx, ok := out.Contexts[out.CurrentContext]
	if !ok {
		return nil, fmt.Errorf("current context %q not found", out.CurrentContext)
	}
	auth, ok := out.AuthInfos[ctx.AuthInfo]
	if !ok {
		return nil, fmt.Errorf("user %q of context %q not found", ctx.AuthInfo, out.CurrentContext)
	}
	as := auth.DeepCopy()
	as.Impersonate, as.ImpersonateGroups = user, groups
	name := ctx.AuthInfo + "-as-" + user
	out.AuthInfos[name] = as
	ctx.AuthInfo = name
	return out, nil
}

// restConfig loads the current context of the kubeconfig file at path.
func restConfig(path string) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", path, err)
	}
	cfg.QPS, cfg.Burst = clientQPS, clientBurst
	return cfg, nil
}
