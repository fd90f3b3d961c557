// nri-injector is another NRI plugin, for the node enforcer's tests: registered after it (a higher index),
// it adds to every container it is shown what its flags say, as NVIDIA's toolkit's NRI plugin adds CDI
// devices from nvidia.cdi.k8s.io/ annotations. Later plugins never see what earlier ones add to CDI devices;
// only a validating plugin does (NRI's ValidateContainerAdjustment), which is what the tests show.
//
//	nri-injector --socket PATH [--index 60] [--cdi-device NAME] [--override-env KEY=VALUE] [--only-container NAME]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

type injector struct {
	cdiDevice, overrideEnv, onlyContainer string
}

func (p *injector) CreateContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	adjust := &api.ContainerAdjustment{}
	if p.onlyContainer != "" && c.GetName() != p.onlyContainer {
		return adjust, nil, nil
	}
	if p.cdiDevice != "" {
		adjust.AddCDIDevice(&api.CDIDevice{Name: p.cdiDevice})
	}
	if key, value, ok := strings.Cut(p.overrideEnv, "="); ok {
		// Removed, then set: NRI then lets a later plugin take over a key an earlier one set.
		adjust.RemoveEnv(key)
		adjust.AddEnv(key, value)
	}
	return adjust, nil, nil
}

func main() {
	socket := flag.String("socket", "", "the runtime's NRI socket")
	index := flag.String("index", "60", "two digits: after the enforcer's 50")
	p := &injector{}
	flag.StringVar(&p.cdiDevice, "cdi-device", "", "a CDI device to add to each container")
	flag.StringVar(&p.overrideEnv, "override-env", "", "KEY=VALUE to set in each container, over an earlier plugin's")
	flag.StringVar(&p.onlyContainer, "only-container", "", "only containers of this name")
	flag.Parse()
	// Connects again whenever the runtime is not there or goes away, as a plugin run by the node would,
	// until it is killed: the tests start it before the runtime and run the runtime more than once.
	for {
		s, err := stub.New(p, stub.WithSocketPath(*socket), stub.WithPluginName("injector"), stub.WithPluginIdx(*index))
		if err != nil {
			fmt.Fprintf(os.Stderr, "nri-injector: %v\n", err)
			os.Exit(2)
		}
		if err := s.Run(context.Background()); err != nil {
			fmt.Fprintf(os.Stderr, "nri-injector: %v; connecting again\n", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
