// Command etcd is the etcd server at the version pinned in this module's go.mod, built by
// hack/build-tools.sh for the local test clusters. It is what etcd's own main does.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
