// The run's own namespaces. The real node needs a network (a bridge, veths, iptables rules), mounts (the
// node's /dev, /run, /etc, /var) and processes (containerd's shims, the containers) that must not outlive
// the run, even when the harness is killed. So the harness runs itself again as PID 1 of new mount,
// network and PID namespaces: when it ends, the kernel kills every process left in them, and the mounts,
// the network namespace and every interface in it go with them. What namespaces do not cover is put back
// by the outer process afterwards: the kubelet's cgroups (under a cgroup root named for the run) and the
// kernel settings it changes.
package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	// Set for the inner run: the cgroup root, under every hierarchy, that the kubelet is to use.
	cgroupRootEnv = "GPUGUARD_E2E_CGROUP_ROOT"
	cgroupFS      = "/sys/fs/cgroup"
)

// The kernel settings the kubelet sets at start when protectKernelDefaults is false (its
// setupKernelTunables): global, not namespaced, so they are put back.
var kubeletSysctls = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"}

func insideRunNamespaces() bool { return os.Getenv(cgroupRootEnv) != "" }

// runInNamespaces runs this program again, with the same arguments, in new namespaces, and returns its
// exit status once it and everything it started have ended and the host is as it was.
func runInNamespaces() int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "gpuguard-e2e: needs root: the real node runs in namespaces of its own (CI runs as root)")
		return 2
	}
	saved := map[string]string{}
	for _, key := range kubeletSysctls {
		if value, err := os.ReadFile(filepath.Join("/proc/sys", key)); err == nil {
			saved[key] = string(value)
		}
	}
	cgroupRoot := "gpuguard-e2e-" + strconv.Itoa(os.Getpid())
	cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
	cmd.Env = append(os.Environ(), cgroupRootEnv+"="+cgroupRoot)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWNET | syscall.CLONE_NEWPID,
		Pdeathsig:  syscall.SIGKILL,
	}
	status := 1
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "gpuguard-e2e: starting the run in its own namespaces: %v\n", err)
	} else {
		stop := forwardSignals(cmd.Process)
		err := cmd.Wait()
		stop()
		var exit *exec.ExitError
		switch {
		case err == nil:
			status = 0
		case errors.As(err, &exit) && exit.ExitCode() >= 0:
			status = exit.ExitCode()
		default:
			fmt.Fprintf(os.Stderr, "gpuguard-e2e: the run in its own namespaces: %v\n", err)
		}
	}
	for key, value := range saved {
		if err := os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "gpuguard-e2e: putting back %s: %v\n", key, err)
			status = 1
		}
	}
	if err := removeCgroupRoot(cgroupRoot); err != nil {
		fmt.Fprintf(os.Stderr, "gpuguard-e2e: %v\n", err)
		status = 1
	}
	return status
}

// cgroupHierarchies lists the mounted cgroup hierarchies (v1 controllers, named ones, a v2 one).
func cgroupHierarchies() []string {
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return nil
	}
	var dirs []string
	for _, line := range strings.Split(string(mounts), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 2 && (fields[2] == "cgroup" || fields[2] == "cgroup2") && strings.HasPrefix(fields[1], cgroupFS+"/") {
			dirs = append(dirs, fields[1])
		}
	}
	return dirs
}

// makeCgroupRoot creates the run's cgroup root in every hierarchy: the kubelet refuses a root that does
// not exist. A new cpuset is empty, so it gets its parent's CPUs and memory nodes.
func makeCgroupRoot(name string) error {
	for _, hierarchy := range cgroupHierarchies() {
		dir := filepath.Join(hierarchy, name)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("creating cgroup %s: %w", dir, err)
		}
		for _, file := range []string{"cpuset.cpus", "cpuset.mems"} {
			if value, err := os.ReadFile(filepath.Join(hierarchy, file)); err == nil {
				if err := os.WriteFile(filepath.Join(dir, file), value, 0o644); err != nil {
					return fmt.Errorf("setting %s/%s: %w", dir, file, err)
				}
			}
		}
	}
	return nil
}

// removeCgroupRoot removes the run's cgroup root and everything under it, deepest first, in every
// hierarchy. It runs once the run's PID 1 has ended, when the kernel is killing what was left in its
// namespace: a cgroup whose last process is still exiting is busy, so it is tried again for a while.
func removeCgroupRoot(name string) error {
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if err = removeCgroupTrees(name); err == nil || time.Now().After(deadline) {
			return err
		}
	}
}

func removeCgroupTrees(name string) error {
	var failed []string
	for _, hierarchy := range cgroupHierarchies() {
		var dirs []string
		filepath.WalkDir(filepath.Join(hierarchy, name), func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		slices.Reverse(dirs)
		for _, dir := range dirs {
			if err := syscall.Rmdir(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
				failed = append(failed, fmt.Sprintf("%s: %v", dir, err))
			}
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("cgroups left behind: %s", strings.Join(failed, "; "))
	}
	return nil
}

// reapAsInit is the inner run's PID 1: every process whose parent ends in the namespace is re-parented
// to it (containerd's shims, which fork twice), so it prepares the namespaces, runs the harness as its
// child, reaps whatever ends until the harness does, and exits with the harness's status.
func reapAsInit() int {
	if err := prepareRunNamespaces(); err != nil {
		fmt.Fprintf(os.Stderr, "gpuguard-e2e: %v\n", err)
		return 1
	}
	cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "gpuguard-e2e: starting the harness: %v\n", err)
		return 1
	}
	forwardSignals(cmd.Process)
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "gpuguard-e2e: waiting for the harness: %v\n", err)
			return 1
		}
		if pid == cmd.Process.Pid {
			if status.Signaled() {
				return 128 + int(status.Signal())
			}
			return status.ExitStatus()
		}
	}
}

// prepareRunNamespaces is the inner run's first step: its mounts stop propagating to the machine, /proc
// shows its own PID namespace, and loopback is up (every listener of the run is on 127.0.0.1 or in it).
func prepareRunNamespaces() error {
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making / private: %w", err)
	}
	if err := syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc: %w", err)
	}
	return run("ip", "link", "set", "lo", "up")
}

// forwardSignals passes SIGINT and SIGTERM on to the process until the returned function is called.
func forwardSignals(p *os.Process) (stop func()) {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	go func() {
		for s := range signals {
			p.Signal(s)
		}
	}()
	return func() { signal.Stop(signals) }
}
