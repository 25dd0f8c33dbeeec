package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/berthfleet/berth/fence"
	"github.com/berthfleet/berth/leaseapi/client"
)

const exitUsage = fence.ExitUsage

// runInstall is `berth-fence install DIR`.
func runInstall(args []string, stdout, stderr io.Writer) int {
	if len(args) != 1 || args[0] == "" {
		fmt.Fprintf(stderr, "%s", usage)
		return exitUsage
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "berth-fence: find own executable: %v\n", err)
		return 1
	}
	dst, err := fence.Install(self, args[0])
	if err != nil {
		fmt.Fprintf(stderr, "berth-fence: %v\n", err)
		return 1
	}
	fence.NewLogger(stdout).Event(fence.EventInstalled, "path", dst, "version", version)
	return 0
}

// runExec is `berth-fence exec [--once] -- CMD [ARGS...]`.
func runExec(args []string, stderr io.Writer) int {
	once := len(args) > 0 && args[0] == "--once"
	if once {
		args = args[1:]
	}
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintf(stderr, "%s", usage)
		return exitUsage
	}
	log := fence.NewLogger(stderr)
	cfg, err := fence.ConfigFromEnv(os.Getenv)
	if err != nil {
		log.Event(fence.EventExiting, "code", fence.ExitConfig, "error", err)
		return fence.ExitConfig
	}
	confirmer, err := newClient(cfg)
	if err != nil {
		log.Event(fence.EventExiting, "code", fence.ExitConfig, "error", err)
		return fence.ExitConfig
	}
	// Signals are taken before anything runs, so none is lost between the
	// start of the child and the supervisor's loop.
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	s := &fence.Supervisor{
		Namespace: cfg.Namespace,
		Name:      cfg.Name,
		Identity:  fence.FileIdentity{HolderFile: cfg.HolderFile, TokenFile: cfg.TokenOfPodFile},
		Confirmer: confirmer,
		Starter:   fence.ProcessStarter{Path: args[0], Args: args[1:]},
		Environ:   os.Environ(),
		Clock:     fence.BootClock{},
		Signals:   signals,
		Log:       log,
		Once:      once,
	}
	return s.Run()
}

// newClient builds the lease API client: the projected service account
// token re-read from its file for every request (the kubelet rotates it),
// and the CA bundle given as PEM text handed to the client through a
// memory file, so that no writable file system is needed.
func newClient(cfg fence.EnvConfig) (*client.Client, error) {
	ccfg := client.Config{URL: cfg.URL, TokenFile: cfg.TokenFile}
	pem, err := cfg.CAPEM()
	if err != nil {
		return nil, err
	}
	if len(pem) > 0 {
		fd, err := unix.MemfdCreate("berth-lease-api-ca", unix.MFD_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("%w: hold the CA bundle: %w", fence.ErrConfig, err)
		}
		f := os.NewFile(uintptr(fd), "berth-lease-api-ca")
		defer f.Close()
		if _, err := f.Write(pem); err != nil {
			return nil, fmt.Errorf("%w: hold the CA bundle: %w", fence.ErrConfig, err)
		}
		ccfg.CAFile = fmt.Sprintf("/proc/self/fd/%d", fd)
	}
	c, err := client.New(ccfg)
	if err != nil {
		return nil, errors.Join(fence.ErrConfig, err)
	}
	return c, nil
}
