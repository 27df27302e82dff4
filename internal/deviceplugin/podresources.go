package deviceplugin

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// PodDevices is one pod's devices of one resource, from kubelet's
// PodResources API.
type PodDevices struct {
	Namespace, Name string
	DeviceIDs       []string
}

// ListAllocated asks kubelet (its pod-resources socket) which pods hold
// devices of each resource: resource name → pods.
func ListAllocated(ctx context.Context, socket string) (map[string][]PodDevices, error) {
	target := socket
	if !strings.HasPrefix(target, "unix://") {
		target = "unix://" + target
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("podresources: %w", err)
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := podresourcesapi.NewPodResourcesListerClient(conn).List(cctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("podresources: List: %w", err)
	}
	out := map[string][]PodDevices{}
	for _, p := range resp.PodResources {
		byRes := map[string][]string{}
		for _, c := range p.Containers {
			for _, d := range c.Devices {
				byRes[d.ResourceName] = append(byRes[d.ResourceName], d.DeviceIds...)
			}
		}
		for res, ids := range byRes {
			out[res] = append(out[res], PodDevices{Namespace: p.Namespace, Name: p.Name, DeviceIDs: ids})
		}
	}
	return out, nil
}
