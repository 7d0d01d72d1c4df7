// Command vcsim runs govmomi's vCenter simulator for the labs-k8s tests.
//
// Why our own main: since govmomi v0.47 the upstream vcsim command is a module of its own
// (github.com/vmware/govmomi/vcsim) that the Go module proxy does not serve, while the
// simulator library it wraps (github.com/vmware/govmomi/simulator) is served at the pinned
// version. This main keeps the flag names the tests pass (a subset of upstream vcsim's) and
// adds one thing upstream has no flag for:
//
//   - LABS_K8S_VCSIM_PASSWORD_FILE: every login is checked against that file's current
//     content, so a test can rotate the vCenter password while the inventory lives on.
//     It uses the simulator's own hook, SessionManager.ValidLogin (simulator/session_manager.go
//     Authenticate), not a patch. Sessions already logged in stay valid, as on a real vCenter.
//
// Each session's default PropertyCollector answers WaitForUpdatesEx by the version its caller
// passes (collector.go says why), so the vSphere provider's concurrent task waits each see theirs.
//
// DRS settings (drsConfig.enabled, defaultVmBehavior) are applied by this simulator version
// itself (simulator/cluster_compute_resource.go updateDrsConfig), which the older Debian
// build needed a backport for.
//
// On start it prints `export GOVC_URL=https://USER:PASS@HOST:PORT/sdk GOVC_SIM_PID=PID`, as
// upstream vcsim does; SIGINT/SIGTERM stop it and remove its temporary datastore directories.
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"log"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/google/uuid"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/simulator/esx"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/types"

	// Register the SPBM endpoint (/pbm), as upstream vcsim does: terraform-provider-vsphere's
	// client makes its pbm.NewClient while it configures (vsphere/config.go Client), and without it the real
	// provider fails with `POST /pbm: 404` before its first call.
	_ "github.com/vmware/govmomi/pbm/simulator"
	// Register the vAPI endpoints (tags, content library), as upstream vcsim does.
	_ "github.com/vmware/govmomi/vapi/simulator"
)

func main() {
	model := simulator.VPX()
	listen := flag.String("l", "127.0.0.1:8989", "listen address (port 0: the kernel picks one)")
	username := flag.String("username", "user", "login user name")
	password := flag.String("password", "pass", "login password (see LABS_K8S_VCSIM_PASSWORD_FILE)")
	tlsCert := flag.String("tlscert", "", "PEM certificate to serve (default: a built-in self-signed one)")
	tlsKey := flag.String("tlskey", "", "PEM private key of -tlscert")
	flag.IntVar(&model.Datacenter, "dc", model.Datacenter, "number of datacenters")
	flag.IntVar(&model.Cluster, "cluster", model.Cluster, "number of clusters per datacenter")
	flag.IntVar(&model.ClusterHost, "host", model.ClusterHost, "number of hosts per cluster")
	flag.IntVar(&model.Host, "standalone-host", model.Host, "number of standalone hosts per datacenter")
	flag.IntVar(&model.Machine, "vm", model.Machine, "number of virtual machines per resource pool")
	flag.IntVar(&model.Datastore, "ds", model.Datastore, "number of local datastores")
	flag.IntVar(&model.Portgroup, "pg", model.Portgroup, "number of distributed port groups")
	flag.Parse()

	// Answer as vCenter 8.0 U3, what sites run: the simulator's default About (6.5) makes
	// /sdk/vimServiceVersions.xml advertise API 6.5, and pyVmomi 9 then speaks vim.version.version11,
	// in which it cannot read a VM's `runtime` or `summary` (AttributeError) at all.
	model.ServiceContent.About.Version = "8.0.3"
	model.ServiceContent.About.ApiVersion = "8.0.3.0"
	model.ServiceContent.About.FullName = "VMware vCenter Server 8.0.3 (govmomi simulator)"

	if err := model.Create(); err != nil {
		log.Fatalf("vcsim: creating the inventory: %v", err)
	}
	defer model.Remove()
	registry := model.Map()
	for _, vm := range registry.All("VirtualMachine") {
		setRuntimeEnums(vm)
		newUUIDForNewVM(vm)
	}
	registry.AddHandler(runtimeEnumDefaults{})
	installVersionedCollector(registry, model.ServiceContent.PropertyCollector)
	setDefaultHardwareVersion(registry)

	model.Service.RegisterEndpoints = true
	model.Service.Listen = &url.URL{Host: *listen, User: url.UserPassword(*username, *password)}
	model.Service.TLS = new(tls.Config)
	if *tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(*tlsCert, *tlsKey)
		if err != nil {
			log.Fatalf("vcsim: -tlscert/-tlskey: %v", err)
		}
		model.Service.TLS.Certificates = []tls.Certificate{cert}
	}
	if name := os.Getenv("LABS_K8S_VCSIM_PASSWORD_FILE"); name != "" {
		model.Map().SessionManager().ValidLogin = func(req *types.Login) bool {
			data, err := os.ReadFile(name)
			if err != nil {
				return false
			}
			return req.UserName == *username && req.Password == strings.TrimRight(string(data), "\n")
		}
	}

	server := model.Service.NewServer()
	defer server.Close()
	fmt.Printf("export GOVC_URL=%s GOVC_SIM_PID=%d\n", server.URL, os.Getpid())

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
}

// runtimeEnumDefaults gives every VM the swapPlacement vCenter reports (below), and the
// runtime.faultToleranceState and recordReplayState a
// vCenter reports for a VM without Fault Tolerance or record/replay: "notConfigured", "inactive".
// The simulator leaves both empty, and both fields are required (no omitempty in vim25/types), so
// it sends empty enums that pyVmomi 9 cannot parse: reading vm.runtime or vm.summary then fails
// with AttributeError.
type runtimeEnumDefaults struct{}

func (runtimeEnumDefaults) Reference() types.ManagedObjectReference {
	return types.ManagedObjectReference{Type: "LabsK8sTestHook", Value: "runtime-enum-defaults"}
}

func (runtimeEnumDefaults) PutObject(_ *simulator.Context, obj mo.Reference) {
	setRuntimeEnums(obj)
	newUUIDForNewVM(obj)
}

// uuidOwners: which VM (managed object id) each BIOS uuid was given to.
var (
	uuidOwners   = map[string]string{}
	uuidOwnersMu sync.Mutex
)

// newUUIDForNewVM gives a new VM a BIOS uuid no earlier VM had, as vCenter does. The simulator
// derives it from the VM's path (simulator/virtual_machine.go NewVirtualMachine:
// internal.OID(VmPathName)), so a VM replaced under the same name (deleted, then cloned again)
// came back with the old uuid: the vSphere provider's id of the new VM equalled the old one's, and
// whatever tells one VM from the next by that id (the host-key step's pin) took it for the same.
func newUUIDForNewVM(obj mo.Reference) {
	vm, ok := obj.(*simulator.VirtualMachine)
	if !ok || vm.Config == nil {
		return
	}
	uuidOwnersMu.Lock()
	defer uuidOwnersMu.Unlock()
	self := vm.Self.Value
	if owner, seen := uuidOwners[vm.Config.Uuid]; seen && owner != self {
		vm.Config.Uuid = uuid.New().String()
		if vm.Summary.Config.Uuid != "" {
			vm.Summary.Config.Uuid = vm.Config.Uuid
		}
	}
	uuidOwners[vm.Config.Uuid] = self
}

func (runtimeEnumDefaults) UpdateObject(*simulator.Context, mo.Reference, []types.PropertyChange) {}

func (runtimeEnumDefaults) RemoveObject(*simulator.Context, types.ManagedObjectReference) {}

func setRuntimeEnums(obj mo.Reference) {
	vm, ok := obj.(*simulator.VirtualMachine)
	if !ok {
		return
	}
	// vCenter reports swapPlacement "inherit" for a VM created without one, and keeps what a
	// reconfigure sets; the simulator reports "" and ignores spec.swapPlacement
	// (simulator/virtual_machine.go configure), so the vSphere provider, which always sends its
	// default "inherit", saw a change on every preview (issue #29).
	if vm.Config != nil && vm.Config.SwapPlacement == "" {
		vm.Config.SwapPlacement = string(types.VirtualMachineConfigInfoSwapPlacementTypeInherit)
	}
	for _, runtime := range []*types.VirtualMachineRuntimeInfo{&vm.Runtime, &vm.Summary.Runtime} {
		if runtime.FaultToleranceState == "" {
			runtime.FaultToleranceState = types.VirtualMachineFaultToleranceStateNotConfigured
		}
		if runtime.RecordReplayState == "" {
			runtime.RecordReplayState = types.VirtualMachineRecordReplayStateInactive
		}
	}
}

// setDefaultHardwareVersion makes QueryConfigOption (no key: the environment's default option)
// name its hardware version in hardwareOptions.hwVersion, as vCenter does (a required field of
// VirtualHardwareOption). The simulator answers 0 there (simulator/environment_browser.go
// QueryConfigOption), and terraform-provider-vsphere compares that number with the VM's own on
// every update with a change (resourceVSphereVirtualMachineUpdate -> SetHardwareVersion, which
// reads ConfigOptions(vm)): 0 < 13, so it called UpgradeVM on a running VM and every in-place update
// (the documented SSH key rotation among them) failed with InvalidPowerStateFault (issue #31).
func setDefaultHardwareVersion(registry *simulator.Registry) {
	var number int32
	if _, err := fmt.Sscanf(esx.HardwareVersion, "vmx-%d", &number); err != nil {
		log.Fatalf("vcsim: cannot read the hardware version %q: %v", esx.HardwareVersion, err)
	}
	var browsers []types.ManagedObjectReference
	for _, obj := range registry.All("ClusterComputeResource") {
		if ref := obj.(*simulator.ClusterComputeResource).EnvironmentBrowser; ref != nil {
			browsers = append(browsers, *ref)
		}
	}
	for _, obj := range registry.All("ComputeResource") {
		if ref := obj.(*mo.ComputeResource).EnvironmentBrowser; ref != nil {
			browsers = append(browsers, *ref)
		}
	}
	for _, ref := range browsers {
		browser, ok := registry.Get(ref).(*simulator.EnvironmentBrowser)
		if !ok {
			continue
		}
		option := browser.QueryConfigOptionResponse.Returnval
		if option == nil {
			option = &types.VirtualMachineConfigOption{Version: esx.HardwareVersion, DefaultDevice: esx.VirtualDevice}
			browser.QueryConfigOptionResponse.Returnval = option
		}
		option.HardwareOptions.HwVersion = number
	}
}
