package main

// versionedCollector is each session's default PropertyCollector, with WaitForUpdatesEx answering
// "what changed since the version the caller passes", as the vSphere API defines it: the version is
// "the data version currently known to the client", and a non-truncated version "may be passed ...
// more than once" (UpdateSet, WaitForUpdatesExRequestType in the vSphere Web Services API reference).
//
// Why: the vSphere provider waits for its VM tasks on the session's one collector, from as many
// goroutines as the engine runs steps (terraform-provider-vsphere virtual_machine_helper.go ->
// govmomi object.Task.WaitForResultEx, which shares the session's collector). The simulator's own
// WaitForUpdatesEx keeps one queue of updates per collector, and whichever of the concurrent waits
// polls first takes all of them (simulator/property_collector.go: `pc.updates = nil`), so the other
// waits never see their task finish and the provider hangs at any --parallel above 1
// (docs/testing.md, "Parallelism against vcsim"). Here each call compares the filters' current
// properties with those of the version it was given, so concurrent waits each see their own change.
//
// The simulator makes each session's instance of the default collector with reflect.New of the
// registered object's type (simulator/session_manager.go Session.Get: "PropertyCollector might be
// wrapped with a custom type"); every other method is the simulator's own, promoted.

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

// collectorState: for each filter, each object it selects, its properties by name.
type collectorState map[types.ManagedObjectReference]map[types.ManagedObjectReference]map[string]types.AnyType

// keptVersions bounds the states kept for versions handed out; a client passes back the last one.
const keptVersions = 1024

// updatePoll: how often a wait compares the state, as the simulator's own wait ticks (20 ms).
const updatePoll = 20 * time.Millisecond

// longestWait: a wait with no maxWaitSeconds returns no update after this long, as vCenter's
// "policy may still cause the PropertyCollector to return null" (WaitOptions); the clients here
// (govmomi, pyVmomi) call again. The simulator cannot see a client go away (its Context is
// context.Background, simulator.go ServeHTTP), so this also ends the polls of a client that left.
const longestWait = 60 * time.Second

type versionedCollector struct {
	simulator.PropertyCollector

	mu       sync.Mutex
	versions map[string]collectorState
	order    []string
	next     int
	waits    map[int]context.CancelFunc
	nextWait int
}

// installVersionedCollector makes the root PropertyCollector of the inventory a versionedCollector,
// so that every session's default collector is one.
func installVersionedCollector(registry *simulator.Registry, ref types.ManagedObjectReference) {
	collector := &versionedCollector{}
	collector.Self = ref
	registry.Put(collector)
}

func (pc *versionedCollector) filters(ctx *simulator.Context) []*simulator.PropertyFilter {
	var refs []types.ManagedObjectReference
	ctx.WithLock(&pc.PropertyCollector, func() { refs = append(refs, pc.Filter...) })
	var filters []*simulator.PropertyFilter
	for _, ref := range refs {
		if filter, ok := ctx.Session.Get(ref).(*simulator.PropertyFilter); ok {
			filters = append(filters, filter)
		}
	}
	return filters
}

// state collects what every filter selects now. An object gone since is simply not there (a
// `leave`), as RetrievePropertiesEx with reportMissingObjectsInResults skips it.
func (pc *versionedCollector) state(ctx *simulator.Context) (collectorState, *soap.Fault) {
	state := collectorState{}
	for _, filter := range pc.filters(ctx) {
		spec := filter.Spec
		spec.ReportMissingObjectsInResults = types.NewBool(true)
		res := pc.RetrievePropertiesEx(ctx, &types.RetrievePropertiesEx{This: pc.Self, SpecSet: []types.PropertyFilterSpec{spec}})
		if fault := res.Fault(); fault != nil {
			return nil, fault
		}
		objects := map[types.ManagedObjectReference]map[string]types.AnyType{}
		if result := res.(*methods.RetrievePropertiesExBody).Res.Returnval; result != nil {
			for _, content := range result.Objects {
				props := map[string]types.AnyType{}
				for _, prop := range content.PropSet {
					props[prop.Name] = prop.Val
				}
				objects[content.Obj] = props
			}
		}
		state[filter.Self] = objects
	}
	return state, nil
}

// changes: what a client that knows `known` has not seen of `now`, filter by filter.
func changes(known, now collectorState) []types.PropertyFilterUpdate {
	var updates []types.PropertyFilterUpdate
	for filter, objects := range now {
		before := known[filter] // a filter made since: each of its objects enters
		update := types.PropertyFilterUpdate{Filter: filter}
		for obj, props := range objects {
			old, seen := before[obj]
			if !seen {
				update.ObjectSet = append(update.ObjectSet, types.ObjectUpdate{Kind: types.ObjectUpdateKindEnter, Obj: obj, ChangeSet: assigned(props, nil)})
			} else if changed := assigned(props, old); len(changed) > 0 {
				update.ObjectSet = append(update.ObjectSet, types.ObjectUpdate{Kind: types.ObjectUpdateKindModify, Obj: obj, ChangeSet: changed})
			}
		}
		for obj := range before {
			if _, there := objects[obj]; !there {
				update.ObjectSet = append(update.ObjectSet, types.ObjectUpdate{Kind: types.ObjectUpdateKindLeave, Obj: obj})
			}
		}
		if len(update.ObjectSet) > 0 {
			updates = append(updates, update)
		}
	}
	return updates
}

func assigned(props, old map[string]types.AnyType) []types.PropertyChange {
	var changed []types.PropertyChange
	for name, val := range props {
		if was, seen := old[name]; !seen || !reflect.DeepEqual(was, val) {
			changed = append(changed, types.PropertyChange{Name: name, Op: types.PropertyChangeOpAssign, Val: val})
		}
	}
	for name := range old {
		if _, there := props[name]; !there {
			changed = append(changed, types.PropertyChange{Name: name, Op: types.PropertyChangeOpAssign})
		}
	}
	return changed
}

func (pc *versionedCollector) remember(state collectorState) string {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.versions == nil {
		pc.versions = map[string]collectorState{}
	}
	pc.next++
	version := fmt.Sprintf("%d", pc.next)
	pc.versions[version] = state
	pc.order = append(pc.order, version)
	if len(pc.order) > keptVersions {
		delete(pc.versions, pc.order[0])
		pc.order = pc.order[1:]
	}
	return version
}

func (pc *versionedCollector) known(version string) (collectorState, bool) {
	if version == "" {
		return collectorState{}, true
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	state, ok := pc.versions[version]
	return state, ok
}

func (pc *versionedCollector) startWait(wait context.Context) (context.Context, int) {
	wait, cancel := context.WithCancel(wait)
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.waits == nil {
		pc.waits = map[int]context.CancelFunc{}
	}
	pc.nextWait++
	pc.waits[pc.nextWait] = cancel
	return wait, pc.nextWait
}

func (pc *versionedCollector) endWait(id int) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if cancel, ok := pc.waits[id]; ok {
		cancel()
		delete(pc.waits, id)
	}
}

// CancelWaitForUpdates cancels every wait of this session's collector in flight, as vCenter does
// ("attempts to cancel outstanding calls to WaitForUpdates or WaitForUpdatesEx in the current session").
func (pc *versionedCollector) CancelWaitForUpdates(*types.CancelWaitForUpdates) soap.HasFault {
	pc.mu.Lock()
	for _, cancel := range pc.waits {
		cancel()
	}
	pc.mu.Unlock()
	return &methods.CancelWaitForUpdatesBody{Res: new(types.CancelWaitForUpdatesResponse)}
}

func (pc *versionedCollector) WaitForUpdatesEx(ctx *simulator.Context, r *types.WaitForUpdatesEx) soap.HasFault {
	body := &methods.WaitForUpdatesExBody{}
	known, ok := pc.known(r.Version)
	if !ok {
		body.Fault_ = simulator.Fault(fmt.Sprintf("unknown version %q", r.Version), new(types.InvalidCollectorVersion))
		return body
	}
	once, limit := false, longestWait
	if r.Options != nil && r.Options.MaxWaitSeconds != nil {
		once = *r.Options.MaxWaitSeconds == 0
		limit = min(limit, time.Duration(*r.Options.MaxWaitSeconds)*time.Second)
	}
	wait, stop := context.WithTimeout(context.Background(), limit)
	defer stop()
	wait, id := pc.startWait(wait)
	defer pc.endWait(id)

	ticker := time.NewTicker(updatePoll)
	defer ticker.Stop()
	for {
		now, fault := pc.state(ctx)
		if fault != nil {
			body.Fault_ = fault
			return body
		}
		if updates := changes(known, now); len(updates) > 0 || r.Version == "" {
			body.Res = &types.WaitForUpdatesExResponse{Returnval: &types.UpdateSet{Version: pc.remember(now), FilterSet: updates}}
			return body
		}
		if once {
			body.Res = &types.WaitForUpdatesExResponse{}
			return body
		}
		select {
		case <-wait.Done():
			if errors.Is(wait.Err(), context.Canceled) { // CancelWaitForUpdates
				body.Fault_ = simulator.Fault("", new(types.RequestCanceled))
				return body
			}
			body.Res = &types.WaitForUpdatesExResponse{} // MaxWaitSeconds passed: no update
			return body
		case <-ticker.C:
		}
	}
}

// WaitForUpdates (deprecated; pyVmomi's WaitForTask still calls it) is WaitForUpdatesEx without
// options, as in the simulator; it has no "no update" answer, so after longestWait it answers an
// empty set at the version it was given, and the client calls again.
func (pc *versionedCollector) WaitForUpdates(ctx *simulator.Context, r *types.WaitForUpdates) soap.HasFault {
	body := &methods.WaitForUpdatesBody{}
	res := pc.WaitForUpdatesEx(ctx, &types.WaitForUpdatesEx{This: r.This, Version: r.Version})
	if fault := res.Fault(); fault != nil {
		body.Fault_ = fault
		return body
	}
	body.Res = &types.WaitForUpdatesResponse{Returnval: types.UpdateSet{Version: r.Version}}
	if set := res.(*methods.WaitForUpdatesExBody).Res.Returnval; set != nil {
		body.Res.Returnval = *set
	}
	return body
}
