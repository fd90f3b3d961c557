// proto-descriptors writes, as one binary FileDescriptorSet, the descriptors of NRI's API and of ttrpc's
// request as the modules e2e/go.mod pins were generated from them, with every file they import. The enforcer
// reads NRI's messages by hand-kept field numbers (include/gpuguard/nri/messages.hpp); its test
// (tests/nri/field_numbers_test.cpp) holds each number, and every field of proto/, to these upstream
// descriptors rather than to another hand-made copy.
//
// Usage: proto-descriptors OUTPUT
package main

import (
	"fmt"
	"os"

	nriapi "github.com/containerd/nri/pkg/api"
	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: proto-descriptors OUTPUT")
		os.Exit(2)
	}
	set := &descriptorpb.FileDescriptorSet{}
	seen := map[string]bool{}
	// Imports first, as a descriptor pool builds them.
	var add func(file protoreflect.FileDescriptor)
	add = func(file protoreflect.FileDescriptor) {
		if seen[file.Path()] {
			return
		}
		seen[file.Path()] = true
		imports := file.Imports()
		for i := 0; i < imports.Len(); i++ {
			add(imports.Get(i).FileDescriptor)
		}
		set.File = append(set.File, protodesc.ToFileDescriptorProto(file))
	}
	add(nriapi.File_pkg_api_api_proto)
	add(ttrpc.File_request_proto)
	out, err := proto.Marshal(set)
	if err == nil {
		err = os.WriteFile(os.Args[1], out, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "proto-descriptors:", err)
		os.Exit(1)
	}
}
