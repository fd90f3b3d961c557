// What the node scenarios ask of a running container, through the CRI that containerd and CRI-O both
// serve, as the kubelet asks it: a command run inside it (ExecSync, the kubelet's exec probes' call) and its PID on the node, from
// which the scenarios look at /proc. One way for both runtimes, so that a scenario reads the same on each.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// criCall dials the runtime's CRI socket for one call of at most two minutes.
func criCall(ctx context.Context, socket string, call func(context.Context, *grpc.ClientConn) error) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	return call(ctx, conn)
}

// criVersion is nil once the runtime answers the CRI.
func criVersion(ctx context.Context, socket string) error {
	return criCall(ctx, socket, func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := runtimeapi.NewRuntimeServiceClient(conn).Version(ctx, &runtimeapi.VersionRequest{})
		return err
	})
}

// criImagePresent is nil when the runtime's image store holds name.
func criImagePresent(ctx context.Context, socket, name string) error {
	return criCall(ctx, socket, func(ctx context.Context, conn *grpc.ClientConn) error {
		status, err := runtimeapi.NewImageServiceClient(conn).ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: name}})
		if err == nil && status.GetImage() == nil {
			err = fmt.Errorf("image %s is not in the runtime's store after the import", name)
		}
		return err
	})
}

// criExec runs command in the container and returns its output; a non-zero exit is an error.
func criExec(ctx context.Context, socket, containerID string, command ...string) (string, error) {
	var out string
	err := criCall(ctx, socket, func(ctx context.Context, conn *grpc.ClientConn) error {
		answer, err := runtimeapi.NewRuntimeServiceClient(conn).ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: containerID, Cmd: command, Timeout: 60})
		if err != nil {
			return err
		}
		out = string(answer.Stdout) + string(answer.Stderr)
		if answer.ExitCode != 0 {
			return fmt.Errorf("%v exited %d: %s", command, answer.ExitCode, out)
		}
		return nil
	})
	return out, err
}

// criPIDs is the node's PID of each running container's first process, and of each ready sandbox's
// where it has one (containerd's pause; CRI-O runs none unless the pod shares its PID namespace), by ID,
// from the runtime's verbose status: its "info" holds the pid, in containerd's and CRI-O's alike.
func criPIDs(ctx context.Context, socket string) (map[string]string, error) {
	pids := map[string]string{}
	err := criCall(ctx, socket, func(ctx context.Context, conn *grpc.ClientConn) error {
		client := runtimeapi.NewRuntimeServiceClient(conn)
		containers, err := client.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
			State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}}})
		if err != nil {
			return err
		}
		for _, c := range containers.Containers {
			pid, err := containerPID(ctx, client, c.Id)
			if err != nil {
				return err
			}
			if pid != 0 {
				pids[c.Id] = strconv.Itoa(pid)
			}
		}
		sandboxes, err := client.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
			State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY}}})
		if err != nil {
			return err
		}
		for _, sandbox := range sandboxes.Items {
			status, err := client.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sandbox.Id, Verbose: true})
			if err == nil && infoPID(status.Info) != 0 {
				pids[sandbox.Id] = strconv.Itoa(infoPID(status.Info))
			}
		}
		return nil
	})
	return pids, err
}

// containerPID is a running container's pid from its verbose status, 0 where it is gone or has exited
// since the list. A container the runtime reports running can be without a pid for a moment around its
// start or stop (seen once in CI, with pods created 50 ms apart): its status is asked again for up to a
// second, and only a running container that never shows one is an error.
func containerPID(ctx context.Context, client runtimeapi.RuntimeServiceClient, id string) (int, error) {
	for attempt := 0; ; attempt++ {
		status, err := client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
		if err != nil {
			return 0, nil // gone since the list
		}
		if pid := infoPID(status.Info); pid != 0 {
			return pid, nil
		}
		if status.GetStatus().GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
			return 0, nil // exited since the list
		}
		if attempt == 20 {
			return 0, fmt.Errorf("container %s: running, with no pid in the runtime's verbose status for 1 s", id)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// infoPID is the pid in a verbose status's "info", 0 where there is none.
func infoPID(info map[string]string) int {
	var parsed struct {
		Pid int `json:"pid"`
	}
	if json.Unmarshal([]byte(info["info"]), &parsed) != nil {
		return 0
	}
	return parsed.Pid
}

// criCreateRuntimeHooks is each createRuntime hook of a container's OCI spec, its path and arguments, from
// the runtime's verbose status (CRI-O's "info" holds the spec it ran the container with).
func criCreateRuntimeHooks(ctx context.Context, socket, id string) ([][]string, error) {
	var hooks [][]string
	err := criCall(ctx, socket, func(ctx context.Context, conn *grpc.ClientConn) error {
		status, err := runtimeapi.NewRuntimeServiceClient(conn).ContainerStatus(ctx,
			&runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
		if err != nil {
			return err
		}
		var parsed struct {
			RuntimeSpec *struct {
				Hooks struct {
					CreateRuntime []struct {
						Path string   `json:"path"`
						Args []string `json:"args"`
					} `json:"createRuntime"`
				} `json:"hooks"`
			} `json:"runtimeSpec"`
		}
		if err := json.Unmarshal([]byte(status.Info["info"]), &parsed); err != nil || parsed.RuntimeSpec == nil {
			return fmt.Errorf("container %s: no runtime spec in the runtime's verbose status (%v)", id, err)
		}
		for _, hook := range parsed.RuntimeSpec.Hooks.CreateRuntime {
			hooks = append(hooks, append([]string{hook.Path}, hook.Args...))
		}
		return nil
	})
	return hooks, err
}
