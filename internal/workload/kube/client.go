package kube

import (
	"os"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Client is a client of the API server: the packages that are handed one
// (the daemon, which passes it on) need not import client-go.
type Client = kubernetes.Interface

// NewClient returns a client for the API server named by kubeconfig, or
// the in-cluster one when gpud runs in a pod, or nil without either.
func NewClient(kubeconfig string) (Client, error) {
	var rc *rest.Config
	var err error
	switch {
	case kubeconfig != "":
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	case os.Getenv("KUBERNETES_SERVICE_HOST") != "":
		rc, err = rest.InClusterConfig()
	default:
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	rc.UserAgent = "gpud"
	return kubernetes.NewForConfig(rc)
}
