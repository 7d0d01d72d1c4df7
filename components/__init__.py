"""labs-k8s: an HA kubeadm Kubernetes lab on vSphere, as one Pulumi program."""
