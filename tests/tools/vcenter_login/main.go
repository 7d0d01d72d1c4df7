// vcenter_login logs in to a vCenter the way the vSphere provider does, and nothing more.
//
// terraform-provider-vsphere (which pulumi-vsphere bridges) builds its SOAP client in
// vsphere/config.go newClientWithKeepAlive: soap.NewClient(u, insecure), vim25.NewClient,
// then session.Manager.Login. soap.NewClient leaves tls.Config.RootCAs nil unless SetRootCAs
// is called (the provider never calls it), so Go's crypto/x509 system roots decide: on Linux
// /etc/ssl/certs (update-ca-certificates), or SSL_CERT_FILE / SSL_CERT_DIR when set.
// tests/test_vcenter_trust.py runs this against vcsim to prove which trust the provider honours.
//
// Usage: vcenter_login https://user:password@host:port/sdk [insecure]
package main

import (
	"context"
	"fmt"
	"net/url"
	"os"

	"github.com/vmware/govmomi/session"
	"github.com/vmware/govmomi/vim25"
	"github.com/vmware/govmomi/vim25/soap"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: vcenter_login https://user:password@host:port/sdk [insecure]")
		os.Exit(2)
	}
	u, err := url.Parse(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	insecure := len(os.Args) > 2 && os.Args[2] == "insecure"
	ctx := context.Background()
	client, err := vim25.NewClient(ctx, soap.NewClient(u, insecure))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := session.NewManager(client).Login(ctx, u.User); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("logged in")
}
