package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], streams{out: os.Stdout, err: os.Stderr, getenv: os.Getenv})
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "berthctl: "+oneLine(err))
		os.Exit(exitCode(err))
	}
}
