// Package satoken verifies Kubernetes service account tokens for the lease
// API: the token a managed Pod's kubelet projects, with which berth-fence
// asks for the confirmation of its one lease (leaseapi.ConfirmAudience).
//
// It owns the fleet's clusters' signing keys (KeySets: one JWKS file per
// cluster, as each kube-apiserver serves it at /openid/v1/jwks) and the
// verification of a token against the keys of the cluster whose holder it
// speaks for (Verifier). It checks signature, expiry and audience offline:
// the lease API holds no credentials to any cluster, so there is no
// TokenReview, and a token's issuer is not checked (the keys decide the
// cluster). What a verified token may do is the server's decision.
package satoken
