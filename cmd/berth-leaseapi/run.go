package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/berthfleet/berth/leaseapi/lease"
	"github.com/berthfleet/berth/leaseapi/satoken"
	"github.com/berthfleet/berth/leaseapi/server"
	"github.com/berthfleet/berth/leaseapi/store"
	"github.com/berthfleet/berth/leaseapi/store/kubernetes"
	"github.com/berthfleet/berth/leaseapi/store/postgres"
	"github.com/berthfleet/berth/leaseapi/store/refclock"
	"github.com/berthfleet/berth/leaseapi/store/sqlite"
)

// shutdownTimeout bounds how long in-flight requests may take to finish.
const shutdownTimeout = 30 * time.Second

func run(ctx context.Context, o options, log logr.Logger) error {
	if err := o.checkLimits(); err != nil {
		return err
	}
	tlsConfig, err := o.tlsConfig()
	if err != nil {
		return err
	}
	var tokens *server.TokenFile
	if o.tokenFile != "" {
		if tokens, err = server.LoadTokenFile(o.tokenFile); err != nil {
			return err
		}
	}
	auth := server.NewAuthenticator(tokens, o.clientCAFile != "", o.admins())
	if err := checkExposure(o.listen, tlsConfig != nil, auth.Enabled()); err != nil {
		return err
	}
	var saKeys *satoken.KeySets
	if o.serviceAccountKeysDir != "" {
		if saKeys, err = satoken.LoadDir(o.serviceAccountKeysDir); err != nil {
			return fmt.Errorf("--service-account-keys-dir: %w", err)
		}
		auth.AcceptServiceAccounts(satoken.NewVerifier(saKeys, nil))
		log.Info("service account keys loaded", "clusters", len(saKeys.Clusters()), "clusterIds", saKeys.Clusters(), "dir", o.serviceAccountKeysDir)
		if !auth.Enabled() {
			log.Info("authentication is off: every caller is an administrator and service account tokens are not verified")
		}
	}

	backend, err := openStore(ctx, o)
	if err != nil {
		return err
	}
	defer func() {
		if err := backend.Close(); err != nil {
			log.Error(err, "close store")
		}
	}()

	metrics := server.NewMetrics()
	st := metrics.InstrumentStore(backend)
	svcOpts := lease.Options{HistoryTerms: o.serviceHistoryTerms(), ClusterTTL: o.clusterTTL}
	if c, ok := backend.(sharedClock); ok {
		// Replicas share the store: all of them judge terms by its clock.
		svcOpts.StoreClock = c
		metrics.ObserveClock(c.Clock())
	}
	svc := lease.NewService(st, svcOpts)
	graced, err := svc.GrantGrace(ctx)
	if err != nil {
		return fmt.Errorf("grant restart grace: %w", err)
	}
	log.Info("restart grace granted", "leases", graced)

	srv := server.New(server.Config{Service: svc, Store: st, Auth: auth, Metrics: metrics, Log: log, Limits: o.limits, Watch: o.watch})
	apiLn, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", o.listen, err)
	}
	api := srv.HTTPServer(tlsConfig)
	// Watch streams never end on their own: end them at shutdown, so that
	// it does not wait for them and their clients resume elsewhere.
	api.RegisterOnShutdown(srv.EndWatches)

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		log.Info("serving lease API", "address", apiLn.Addr().String(), "tls", tlsConfig != nil, "authentication", auth.Enabled(), "store", o.store)
		var err error
		if tlsConfig != nil {
			err = api.ServeTLS(apiLn, o.tlsCertFile, o.tlsKeyFile)
		} else {
			err = api.Serve(apiLn)
		}
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("serve lease API: %w", err)
	})
	g.Go(func() error {
		<-ctx.Done()
		log.Info("shutting down: finishing in-flight requests")
		sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		return api.Shutdown(sctx)
	})
	if o.metricsListen != "" {
		if err := serveMetrics(ctx, g, o.metricsListen, metrics, log); err != nil {
			return err
		}
	}
	g.Go(func() error {
		srv.RunSweeper(ctx)
		return nil
	})
	if feed, ok := backend.(store.LeaseFeed); ok {
		// Replicas share the store: long polls here must hear of releases
		// made through the others.
		g.Go(func() error {
			svc.FollowFeed(ctx, feed, func(err error) { log.Error(err, "lease change feed broke; following it again") })
			return nil
		})
	}
	if tokens != nil || saKeys != nil {
		g.Go(func() error {
			reloadOnHangup(ctx, tokens, saKeys, log)
			return nil
		})
	}
	return g.Wait()
}

// sharedClock is a store whose replicas judge lease terms by its clock.
type sharedClock interface {
	store.Clock
	Clock() *refclock.Clock
}

var (
	_ sharedClock = (*postgres.Store)(nil)
	_ sharedClock = (*kubernetes.Store)(nil)
)

func openStore(ctx context.Context, o options) (store.Store, error) {
	switch o.store {
	case "sqlite":
		return sqlite.Open(ctx, o.sqlitePath)
	case "postgres":
		dsn, err := o.postgresDSNValue()
		if err != nil {
			return nil, err
		}
		return postgres.Open(ctx, dsn, postgres.Options{VerifyOnly: !o.postgresMigrate})
	case "kubernetes":
		cfg, err := kubernetesConfig(o.kubeconfig)
		if err != nil {
			return nil, err
		}
		return kubernetes.Open(ctx, cfg, o.coordinationNamespace)
	default:
		return nil, usageError("--store %q is not supported (supported: sqlite, postgres, kubernetes)", o.store)
	}
}

func serveMetrics(ctx context.Context, g *errgroup.Group, addr string, m *server.Metrics, log logr.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s for metrics: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	ms := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	g.Go(func() error {
		log.Info("serving metrics", "address", ln.Addr().String())
		if err := ms.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve metrics: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		return ms.Shutdown(sctx)
	})
	return nil
}

// reloadOnHangup re-reads the token file and the service account keys
// (either may be nil) on every SIGHUP. Each that fails to load keeps its
// previous content in force.
func reloadOnHangup(ctx context.Context, tokens *server.TokenFile, saKeys *satoken.KeySets, log logr.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			if tokens != nil {
				if err := tokens.Reload(); err != nil {
					log.Error(err, "reload token file; keeping the previous tokens")
				} else {
					log.Info("token file reloaded", "tokens", tokens.Len())
				}
			}
			if saKeys != nil {
				if err := saKeys.Reload(); err != nil {
					log.Error(err, "reload service account keys; keeping the previous keys")
				} else {
					log.Info("service account keys reloaded", "clusters", len(saKeys.Clusters()), "clusterIds", saKeys.Clusters())
				}
			}
		}
	}
}

// checkExposure refuses to serve beyond loopback without both TLS and
// authentication: plain HTTP or anonymous access must never leave the host.
func checkExposure(listen string, tlsOn, authOn bool) error {
	if tlsOn && authOn {
		return nil
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return usageError("--listen %q: %v", listen, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return usageError("--listen %s is not a loopback address: serving beyond this host needs TLS (--tls-cert-file, --tls-key-file) and authentication (--token-file or --client-ca-file)", listen)
}

func (o *options) tlsConfig() (*tls.Config, error) {
	switch {
	case o.tlsCertFile == "" && o.tlsKeyFile == "":
		if o.clientCAFile != "" {
			return nil, usageError("--client-ca-file needs --tls-cert-file and --tls-key-file")
		}
		return nil, nil
	case o.tlsCertFile == "" || o.tlsKeyFile == "":
		return nil, usageError("--tls-cert-file and --tls-key-file go together")
	}
	if _, err := tls.LoadX509KeyPair(o.tlsCertFile, o.tlsKeyFile); err != nil {
		return nil, fmt.Errorf("load serving certificate: %w", err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.clientCAFile != "" {
		pem, err := os.ReadFile(o.clientCAFile)
		if err != nil {
			return nil, fmt.Errorf("read client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("client CA %s holds no PEM certificate", o.clientCAFile)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		if o.tokenFile != "" {
			cfg.ClientAuth = tls.VerifyClientCertIfGiven
		}
	}
	return cfg, nil
}

// postgresDSNValue is --postgres-dsn, or the content of --postgres-dsn-file
// (so that a password can live in a mounted Secret rather than in argv).
func (o *options) postgresDSNValue() (string, error) {
	switch {
	case o.postgresDSN != "" && o.postgresDSNFile != "":
		return "", usageError("--postgres-dsn and --postgres-dsn-file exclude each other")
	case o.postgresDSNFile != "":
		b, err := os.ReadFile(o.postgresDSNFile)
		if err != nil {
			return "", fmt.Errorf("read --postgres-dsn-file: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	case o.postgresDSN == "":
		return "", usageError("--store postgres needs --postgres-dsn or --postgres-dsn-file")
	}
	return o.postgresDSN, nil
}

// kubernetesConfig is the central cluster of --store kubernetes: --kubeconfig,
// or the cluster the server runs in.
func kubernetesConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("--store kubernetes: in-cluster configuration (or pass --kubeconfig): %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load --kubeconfig %s: %w", kubeconfig, err)
	}
	return cfg, nil
}
