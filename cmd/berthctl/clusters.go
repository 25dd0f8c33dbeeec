package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/berthfleet/berth/leaseapi"
)

func newClustersListCommand(o *globalOptions) *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the registered clusters: health, cordon, leases held, last heartbeat",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, err := o.connect()
			if err != nil {
				return err
			}
			ctx, cancel := o.withTimeout(cmd.Context())
			defer cancel()
			items, err := c.ListClusters(ctx)
			if err != nil {
				return err
			}
			if items == nil {
				items = []leaseapi.Cluster{}
			}
			now := o.clock.Now()
			return printObject(o.out, output, leaseapi.ClusterList{Items: items}, func(wide bool) table { return clusterTable(items, now, wide) })
		},
	}
	bindOutput(cmd.Flags(), &output)
	return cmd
}

// newCordonCommand builds `cordon` (cordon true) or `uncordon`.
func newCordonCommand(o *globalOptions, cordon bool) *cobra.Command {
	verb, short, long := "cordon", "Cordon a cluster (administrators only)",
		"Cordon a cluster: its agent hands over every lease it holds (stops the Pods, releases)\nand acquires no more until the cluster is uncordoned. Administrators only."
	if !cordon {
		verb, short, long = "uncordon", "Uncordon a cluster (administrators only)",
			"Uncordon a cluster: its agent may acquire leases again. Administrators only."
	}
	var output outputFormat
	cmd := &cobra.Command{
		Use:   verb + " CLUSTER",
		Short: short,
		Long:  long,
		Args:  exactArgs("CLUSTER"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			if err := leaseapi.ValidateClusterID(id); err != nil {
				return usageErrorf("cluster %q: %w", id, err)
			}
			c, _, err := o.connect()
			if err != nil {
				return err
			}
			ctx, cancel := o.withTimeout(cmd.Context())
			defer cancel()
			call := c.Uncordon
			if cordon {
				call = c.Cordon
			}
			res, err := call(ctx, id)
			if err != nil {
				return err
			}
			if output == formatJSON || output == formatYAML {
				return printObject(o.out, output, res, nil)
			}
			state := "uncordoned"
			if res.Cordoned {
				state = "cordoned"
			}
			_, err = fmt.Fprintf(o.out, "cluster %s %s\n", res.ID, state)
			return err
		},
	}
	bindOutput(cmd.Flags(), &output)
	return cmd
}
