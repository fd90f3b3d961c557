// mps-stand-in is a STAND-IN for NVIDIA's nvidia-smi and nvidia-cuda-mps-control on the end-to-end node,
// which has no GPU and no driver: the node's CDI spec mounts it at both names into the containers NVIDIA's
// runtime gives GPUs, where `nvidia-ctk cdi generate` mounts the driver's programs, and it acts by the name
// it is run under. It is never part of gpuguard's image.
//
//   - nvidia-smi -i <uuid> -c <mode>: says the mode was set.
//   - nvidia-smi --version: says it is the stand-in (NVIDIA's DRA driver's prestart check runs it).
//   - nvidia-cuda-mps-control -d: records its CUDA variables in $CUDA_MPS_LOG_DIRECTORY/stand-in.log, marks
//     the /dev/shm it sees (stand-in-<CUDA_VISIBLE_DEVICES>), and leaves a "daemon" behind, as the real one
//     does: a process of its own session whose PID is kept in the pipe directory beside a `control` file.
//   - nvidia-cuda-mps-control with a command on stdin: records it, and answers as the real one does, failing
//     when no daemon runs; `quit` ends the daemon.
package main

import (
	"bufio"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const daemonArg = "stand-in-daemon"

func main() {
	switch {
	case filepath.Base(os.Args[0]) == "nvidia-smi":
		os.Exit(nvidiaSmi(os.Args[1:]))
	case len(os.Args) == 2 && os.Args[1] == daemonArg:
		daemon()
	case len(os.Args) == 2 && os.Args[1] == "-d":
		os.Exit(startDaemon())
	default:
		os.Exit(command())
	}
}

func nvidiaSmi(args []string) int {
	if len(args) == 1 && args[0] == "--version" {
		fmt.Println("stand-in nvidia-smi of gpuguard's end-to-end node (e2e/cmd/mps-stand-in)")
		return 0
	}
	if len(args) != 4 || args[0] != "-i" || args[2] != "-c" {
		fmt.Printf("stand-in nvidia-smi: unexpected arguments %q\n", args)
		return 2
	}
	fmt.Printf("Set compute mode to %s for GPU %s.\n", args[3], args[1])
	return 0
}

func record(line string) {
	f, err := os.OpenFile(filepath.Join(os.Getenv("CUDA_MPS_LOG_DIRECTORY"), "stand-in.log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Println("stand-in: cannot record:", err)
		return
	}
	defer f.Close()
	fmt.Fprintln(f, line)
}

func pidFile() string {
	return filepath.Join(os.Getenv("CUDA_MPS_PIPE_DIRECTORY"), "stand-in-daemon.pid")
}

func startDaemon() int {
	record(fmt.Sprintf("-d CUDA_VISIBLE_DEVICES=%s CUDA_MPS_PIPE_DIRECTORY=%s CUDA_MPS_LOG_DIRECTORY=%s",
		os.Getenv("CUDA_VISIBLE_DEVICES"), os.Getenv("CUDA_MPS_PIPE_DIRECTORY"), os.Getenv("CUDA_MPS_LOG_DIRECTORY")))
	if err := os.WriteFile("/dev/shm/stand-in-"+os.Getenv("CUDA_VISIBLE_DEVICES"), nil, 0o644); err != nil {
		fmt.Println("stand-in: cannot mark /dev/shm:", err)
		return 1
	}
	os.Remove(pidFile())
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		fmt.Println("stand-in:", err)
		return 1
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Println("stand-in:", err)
		return 1
	}
	if _, err := os.StartProcess(self, []string{"nvidia-cuda-mps-control", daemonArg}, &os.ProcAttr{
		Env: os.Environ(), Files: []*os.File{null, null, null}, Sys: &syscall.SysProcAttr{Setsid: true}}); err != nil {
		fmt.Println("stand-in: cannot start the daemon:", err)
		return 1
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(pidFile()); err == nil {
			return 0
		}
	}
	fmt.Println("stand-in: the daemon did not start")
	return 1
}

// daemon holds the pipe directory's control file until SIGTERM (quit), as the real daemon holds its pipe.
func daemon() {
	control := filepath.Join(os.Getenv("CUDA_MPS_PIPE_DIRECTORY"), "control")
	if err := os.WriteFile(control, nil, 0o666); err != nil {
		os.Exit(1)
	}
	if err := os.WriteFile(pidFile(), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		os.Exit(1)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	os.Remove(control)
	os.Exit(0)
}

func command() int {
	line, _ := bufio.NewReader(os.Stdin).ReadString('\n')
	line = strings.TrimSpace(line)
	record(fmt.Sprintf("[%s] %s", os.Getenv("CUDA_VISIBLE_DEVICES"), line))
	data, err := os.ReadFile(pidFile())
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	stat, statErr := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	// Alive, and not a zombie nobody has reaped yet.
	if err != nil || pid <= 0 || statErr != nil || strings.Contains(string(stat), ") Z ") {
		fmt.Println("Cannot find MPS control daemon process")
		return 1
	}
	switch {
	case line == "quit":
		syscall.Kill(pid, syscall.SIGTERM)
		os.Remove(pidFile())
	case line == "get_default_active_thread_percentage":
		fmt.Println("50.0")
	}
	return 0
}
