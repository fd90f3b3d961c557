// etcd for the end-to-end harness, built from the etcd server module the pinned kube-apiserver already
// depends on: Debian's etcd is older than the apiserver supports, and etcd's own module cannot be
// `go install`ed (its go.mod has relative replaces).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
