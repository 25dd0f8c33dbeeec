package kubeenv

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// ResidentMemory returns the resident memory (RSS) of every process of the clusters that
// kubeenv runs, in bytes, from /proc.
func (e *Env) ResidentMemory() (uint64, error) {
	var total uint64
	for _, c := range e.Clusters {
		for _, pid := range c.pids() {
			rss, err := residentMemory(pid)
			if err != nil {
				return 0, err
			}
			total += rss
		}
	}
	return total, nil
}

// pids returns the process IDs of the cluster's running processes.
func (c *Cluster) pids() []int {
	if c.plane == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.plane.pids()
}

// residentMemory reads VmRSS from /proc/<pid>/status.
func residentMemory(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read memory of process %d: %w", pid, err)
	}
	return parseVmRSS(data)
}

// parseVmRSS returns the VmRSS field of a /proc/<pid>/status file in bytes.
func parseVmRSS(status []byte) (uint64, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		fields := bytes.Fields(sc.Bytes())
		if len(fields) == 3 && string(fields[0]) == "VmRSS:" && string(fields[2]) == "kB" {
			kb, err := strconv.ParseUint(string(fields[1]), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse VmRSS %q: %w", fields[1], err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS in process status")
}
