// cdi-validate reads CDI spec files as a CDI-enabled runtime does, with the reference implementation
// (tags.cncf.io/container-device-interface): version, kind, device names and container edits. The
// device plugin's tests run it on the spec the plugin writes.
package main

import (
	"fmt"
	"os"

	"tags.cncf.io/container-device-interface/pkg/cdi"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cdi-validate SPEC...")
		os.Exit(2)
	}
	failed := false
	for _, path := range os.Args[1:] {
		spec, err := cdi.ReadSpec(path, 0)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			failed = true
			continue
		}
		version, err := cdi.MinimumRequiredVersion(spec.Spec)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			failed = true
			continue
		}
		fmt.Printf("%s: valid, kind %s, %d devices, cdiVersion %s (needs %s)\n",
			path, spec.Kind, len(spec.Devices), spec.Version, version)
	}
	if failed {
		os.Exit(1)
	}
}
