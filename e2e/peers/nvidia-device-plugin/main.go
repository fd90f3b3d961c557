//go:build ignore

// The entry point NVIDIA's device plugin is run with in the e2e. The source in ../shared/peers holds
// NVIDIA's k8s-device-plugin v0.20.0 without its cmd/nvidia-device-plugin (shared/peers/README.md names
// it; the tarball lacks it, and the module proxy does not serve the module). The harness copies this file
// into the unpacked peer, as its cmd/gpuguard-e2e-nvidia-device-plugin, and builds it there with the
// peer's vendored modules; only there do NVIDIA's internal packages resolve, hence the build tag.
//
// Everything that decides what the kubelet sees is NVIDIA's, called as its own main calls it: the config
// from its flags, environment and config file (api/config/v1), the default resources, device discovery
// over NVML (internal/rm), and the gRPC servers that register, list, prefer and allocate
// (internal/plugin). What this file adds is the loop around them, as NVIDIA's has it: start the plugins,
// and start them again when the kubelet's socket is made anew or on SIGHUP; stop on SIGTERM. Its flags
// are NVIDIA's names, environment variables and defaults.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	nvinfo "github.com/NVIDIA/go-nvlib/pkg/nvlib/info"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/fsnotify/fsnotify"
	"github.com/urfave/cli/v2"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	spec "github.com/NVIDIA/k8s-device-plugin/api/config/v1"
	"github.com/NVIDIA/k8s-device-plugin/internal/cdi"
	"github.com/NVIDIA/k8s-device-plugin/internal/imex"
	"github.com/NVIDIA/k8s-device-plugin/internal/plugin"
	"github.com/NVIDIA/k8s-device-plugin/internal/rm"
	"github.com/NVIDIA/k8s-device-plugin/internal/watch"
)

func main() {
	flags := []cli.Flag{
		&cli.StringFlag{Name: "mig-strategy", Value: spec.MigStrategyNone, EnvVars: []string{"MIG_STRATEGY"}},
		&cli.BoolFlag{Name: "fail-on-init-error", Value: true, EnvVars: []string{"FAIL_ON_INIT_ERROR"}},
		&cli.StringFlag{Name: "driver-root", Value: "/", EnvVars: []string{"NVIDIA_DRIVER_ROOT"}},
		&cli.StringFlag{Name: "dev-root", EnvVars: []string{"NVIDIA_DEV_ROOT"}},
		&cli.BoolFlag{Name: "pass-device-specs", EnvVars: []string{"PASS_DEVICE_SPECS"}},
		&cli.StringSliceFlag{Name: "device-list-strategy", Value: cli.NewStringSlice(string(spec.DeviceListStrategyEnvVar)), EnvVars: []string{"DEVICE_LIST_STRATEGY"}},
		&cli.StringFlag{Name: "device-id-strategy", Value: spec.DeviceIDStrategyUUID, EnvVars: []string{"DEVICE_ID_STRATEGY"}},
		&cli.BoolFlag{Name: "gdrcopy-enabled", EnvVars: []string{"GDRCOPY_ENABLED"}},
		&cli.BoolFlag{Name: "gds-enabled", EnvVars: []string{"GDS_ENABLED"}},
		&cli.BoolFlag{Name: "mofed-enabled", EnvVars: []string{"MOFED_ENABLED"}},
		&cli.StringFlag{Name: "cdi-annotation-prefix", Value: spec.DefaultCDIAnnotationPrefix, EnvVars: []string{"CDI_ANNOTATION_PREFIX"}},
		&cli.StringFlag{Name: "nvidia-cdi-hook-path", Value: spec.DefaultNvidiaCTKPath, EnvVars: []string{"NVIDIA_CDI_HOOK_PATH", "NVIDIA_CTK_PATH"}},
		&cli.StringFlag{Name: "container-driver-root", Value: spec.DefaultContainerDriverRoot, EnvVars: []string{"DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"}},
		&cli.StringFlag{Name: "mps-root", EnvVars: []string{"MPS_ROOT"}},
		&cli.StringFlag{Name: "shared-devices-allocation-policy", Value: spec.AllocationPolicyDistributed, EnvVars: []string{"SHARED_DEVICES_ALLOCATION_POLICY"}},
		&cli.StringFlag{Name: "device-discovery-strategy", Value: "auto", EnvVars: []string{"DEVICE_DISCOVERY_STRATEGY"}},
		&cli.IntSliceFlag{Name: "imex-channel-ids", EnvVars: []string{"IMEX_CHANNEL_IDS"}},
		&cli.BoolFlag{Name: "imex-required", EnvVars: []string{"IMEX_REQUIRED"}},
		&cli.StringFlag{Name: "kubelet-socket", Value: pluginapi.KubeletSocket, EnvVars: []string{"KUBELET_SOCKET"}},
		&cli.StringFlag{Name: "config-file", EnvVars: []string{"CONFIG_FILE"}},
		&cli.StringSliceFlag{Name: "cdi-feature-flags", EnvVars: []string{"CDI_FEATURE_FLAGS"}},
		&cli.StringSliceFlag{Name: "cdi-disable-hooks", EnvVars: []string{"CDI_DISABLE_HOOKS"}},
	}
	app := &cli.App{
		Name:   "nvidia-device-plugin",
		Usage:  "NVIDIA's device plugin v0.20.0, run by gpuguard's e2e (e2e/peers/nvidia-device-plugin)",
		Flags:  flags,
		Action: func(c *cli.Context) error { return run(c, flags) },
	}
	if err := app.Run(os.Args); err != nil {
		klog.Error(err)
		os.Exit(1)
	}
}

// run starts the plugins, and starts them again whenever the kubelet's socket is created anew (a kubelet
// restart forgets every registration) or on SIGHUP, until another signal ends it.
func run(c *cli.Context, flags []cli.Flag) error {
	kubeletSocket := c.String("kubelet-socket")
	watcher, err := watch.Files(filepath.Dir(kubeletSocket))
	if err != nil {
		return fmt.Errorf("watching %s: %w", filepath.Dir(kubeletSocket), err)
	}
	defer watcher.Close()
	signals := watch.Signals(syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT)

	for {
		plugins, retry, err := startPlugins(c, flags, kubeletSocket)
		if err != nil {
			return err
		}
		var retryAfter <-chan time.Time
		if retry {
			retryAfter = time.After(30 * time.Second)
		}
		restart := false
		for !restart {
			select {
			case <-retryAfter:
				restart = true
			case event := <-watcher.Events:
				if event.Name == kubeletSocket && event.Op&fsnotify.Create != 0 {
					klog.Infof("%s created: starting the plugins again", kubeletSocket)
					restart = true
				}
			case err := <-watcher.Errors:
				klog.Infof("inotify: %v", err)
			case s := <-signals:
				if s != syscall.SIGHUP {
					klog.Infof("%v: stopping", s)
					return stopPlugins(plugins)
				}
				klog.Info("SIGHUP: starting the plugins again")
				restart = true
			}
		}
		if err := stopPlugins(plugins); err != nil {
			return err
		}
	}
}

// startPlugins builds NVIDIA's config and plugins as its own main does, and starts each plugin that has
// devices; retry says that one failed to start.
func startPlugins(c *cli.Context, flags []cli.Flag, kubeletSocket string) (plugins []plugin.Interface, retry bool, err error) {
	config, err := spec.NewConfig(c, flags)
	if err != nil {
		return nil, false, fmt.Errorf("config: %w", err)
	}
	config.Flags.GFD = nil
	spec.DisableResourceNamingInConfig(config)

	driverRoot := *config.Flags.Plugin.ContainerDriverRoot
	nvmllib := nvml.New(nvml.WithLibraryPath(libraryUnder(driverRoot, "libnvidia-ml.so.1")))
	devicelib := device.New(nvmllib)
	infolib := nvinfo.New(nvinfo.WithRoot(driverRoot), nvinfo.WithNvmlLib(nvmllib), nvinfo.WithDeviceLib(devicelib))

	strategies, err := spec.NewDeviceListStrategies(*config.Flags.Plugin.DeviceListStrategy)
	if err != nil {
		return nil, false, fmt.Errorf("--device-list-strategy: %w", err)
	}
	if err := rm.AddDefaultResourcesToConfig(infolib, nvmllib, devicelib, config); err != nil {
		return nil, false, fmt.Errorf("default resources: %w", err)
	}
	shown, _ := json.MarshalIndent(config, "", "  ")
	klog.Infof("Running with config:\n%s", shown)

	devRoot := "/"
	if stat, err := os.Stat(filepath.Join(driverRoot, "dev")); err == nil && stat.IsDir() {
		devRoot = driverRoot
	}
	channels, err := imex.GetChannels(config, devRoot)
	if err != nil {
		return nil, false, fmt.Errorf("IMEX channels: %w", err)
	}
	discovery := *config.Flags.DeviceDiscoveryStrategy
	if discovery == "auto" {
		discovery = "nvml"
		if infolib.ResolvePlatform() == nvinfo.PlatformTegra {
			discovery = "tegra"
		}
	}
	klog.Infof("Device discovery: %s", discovery)
	cdiHandler, err := cdi.New(infolib, nvmllib, devicelib,
		cdi.WithDeviceListStrategies(strategies),
		cdi.WithDriverRoot(driverRoot),
		cdi.WithDevRoot(devRoot),
		cdi.WithTargetDriverRoot(*config.Flags.NvidiaDriverRoot),
		cdi.WithTargetDevRoot(*config.Flags.NvidiaDevRoot),
		cdi.WithNvidiaCTKPath(*config.Flags.Plugin.NvidiaCTKPath),
		cdi.WithDeviceIDStrategy(*config.Flags.Plugin.DeviceIDStrategy),
		cdi.WithVendor("k8s.device-plugin.nvidia.com"),
		cdi.WithGdrcopyEnabled(*config.Flags.GDRCopyEnabled),
		cdi.WithGdsEnabled(*config.Flags.GDSEnabled),
		cdi.WithMofedEnabled(*config.Flags.MOFEDEnabled),
		cdi.WithImexChannels(channels),
		cdi.WithFeatureFlags(c.StringSlice("cdi-feature-flags")...),
		cdi.WithDisabledHooks(c.StringSlice("cdi-disable-hooks")...),
		cdi.WithDeviceDiscoveryStrategy(discovery),
	)
	if err != nil {
		return nil, false, fmt.Errorf("CDI handler: %w", err)
	}
	plugins, err = plugin.New(c.Context, infolib, nvmllib, devicelib,
		plugin.WithCDIHandler(cdiHandler),
		plugin.WithConfig(config),
		plugin.WithDeviceListStrategies(strategies),
		plugin.WithFailOnInitError(*config.Flags.FailOnInitError),
		plugin.WithImexChannels(channels),
		plugin.WithDeviceDiscoveryStrategy(discovery),
	)
	if err != nil {
		return nil, false, fmt.Errorf("plugins: %w", err)
	}
	if err := cdiHandler.CreateSpecFile(); err != nil {
		return nil, false, fmt.Errorf("CDI spec: %w", err)
	}
	started := 0
	for _, p := range plugins {
		if len(p.Devices()) == 0 {
			continue
		}
		if err := p.Start(kubeletSocket); err != nil {
			klog.Errorf("a plugin failed to start: %v; starting them again in 30 s", err)
			return plugins, true, nil
		}
		started++
	}
	if started == 0 {
		klog.Info("No devices found. Waiting indefinitely.")
	}
	return plugins, false, nil
}

func stopPlugins(plugins []plugin.Interface) error {
	var errs error
	for _, p := range plugins {
		errs = errors.Join(errs, p.Stop())
	}
	return errs
}

// libraryUnder is the library under the driver's root in the usual library directories, or the bare
// name (for the dynamic loader's own search) when the root is / or holds none.
func libraryUnder(root, name string) string {
	if root == "" || root == "/" {
		return name
	}
	for _, dir := range []string{"/usr/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib64",
		"/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu"} {
		if resolved, err := filepath.EvalSymlinks(filepath.Join(root, dir, name)); err == nil {
			return resolved
		}
	}
	return name
}
