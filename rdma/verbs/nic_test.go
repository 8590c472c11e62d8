package verbs

import (
	"context"
	"errors"
	"os"
	"slices"
	"testing"

	"github.com/tensorferry/tensorferry/internal/ibverbs"
	"github.com/tensorferry/tensorferry/internal/pcitopo"
	"github.com/tensorferry/tensorferry/rdma"
	"github.com/tensorferry/tensorferry/tensor"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

func names(devs []ibverbs.DeviceInfo) []string {
	var out []string
	for _, d := range devs {
		out = append(out, d.Name)
	}
	return out
}

// TestNICOrder: the devices are tried nearest the GPU first, libibverbs
// order within a class, unranked devices last; without a GPU, as listed.
func TestNICOrder(t *testing.T) {
	devs := []ibverbs.DeviceInfo{{Name: "mlx5_0"}, {Name: "mlx5_1"}, {Name: "mlx5_2"}, {Name: "mlx5_3"}, {Name: "rxe0"}}
	plan := nicPlan{gpu: "0000:1b:00.0", rank: pcitopo.GPU{NICs: []pcitopo.Path{
		{NIC: "mlx5_3", Class: pcitopo.ClassPIX}, {NIC: "mlx5_1", Class: pcitopo.ClassPIX},
		{NIC: "mlx5_0", Class: pcitopo.ClassNode}, {NIC: "mlx5_2", Class: pcitopo.ClassSys},
	}}}
	got, class := plan.order(devs)
	if want := []string{"mlx5_3", "mlx5_1", "mlx5_0", "mlx5_2", "rxe0"}; !slices.Equal(names(got), want) {
		t.Errorf("order %v, want %v", names(got), want)
	}
	if class["mlx5_1"] != pcitopo.ClassPIX || class["mlx5_2"] != pcitopo.ClassSys || class["rxe0"] != pcitopo.ClassUnknown {
		t.Errorf("classes %v", class)
	}
	if !slices.Equal(plan.nearest(), []string{"mlx5_3", "mlx5_1"}) {
		t.Errorf("nearest %v", plan.nearest())
	}
	if !slices.Equal(names(devs), []string{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "rxe0"}) {
		t.Error("order changed its argument")
	}
	got, _ = nicPlan{}.order(devs)
	if !slices.Equal(names(got), names(devs)) {
		t.Errorf("no GPU: order %v", names(got))
	}
}

func TestConfigGPUMalformed(t *testing.T) {
	env := &rdma.Env{Store: tensor.NewStore("a", 1), Control: func(context.Context, string, string, []byte) ([]byte, error) { return nil, nil }}
	if _, err := NewWithConfig(env, Config{GPU: "gpu0"}); !errors.Is(err, pcitopo.ErrBadBusID) {
		t.Errorf("Config.GPU %q: %v, want ErrBadBusID", "gpu0", err)
	}
}

func TestPlanNICs(t *testing.T) {
	if p := planNICs("not a bus id", t.TempDir()); !errors.Is(p.err, pcitopo.ErrBadBusID) || len(p.rank.NICs) != 0 {
		t.Errorf("malformed bus id: %+v", p)
	}
	if p := planNICs("0000:1b:00.0", t.TempDir()); p.err == nil {
		t.Errorf("absent GPU: no error")
	}
}

// TestNICReport: a NIC across sockets, a farther NIC taken because the
// nearest had no usable port, and an unrankable GPU are warnings.
func TestNICReport(t *testing.T) {
	rank := pcitopo.GPU{NICs: []pcitopo.Path{{NIC: "mlx5_0", Class: pcitopo.ClassPIX}, {NIC: "mlx5_4", Class: pcitopo.ClassSys}}}
	for _, tc := range []struct {
		plan  nicPlan
		nic   string
		class pcitopo.Class
		warn  string // "" for none
	}{
		{nicPlan{gpu: "g", rank: rank}, "mlx5_0", pcitopo.ClassPIX, ""},
		{nicPlan{gpu: "g", rank: rank}, "mlx5_4", pcitopo.ClassSys, "verbs: the GPU's NIC is across sockets (SYS): GPUDirect RDMA will be slow or refused"},
		{nicPlan{gpu: "g", rank: pcitopo.GPU{NICs: []pcitopo.Path{{NIC: "a", Class: pcitopo.ClassPIX}, {NIC: "b", Class: pcitopo.ClassNode}}}}, "b", pcitopo.ClassNode, "verbs: no NIC of the GPU's nearest class has a usable port; taking a farther one"},
		{nicPlan{gpu: "g", err: errors.New("no such device")}, "rxe0", pcitopo.ClassUnknown, "verbs: GPU's distance to the NICs unknown; taking the first usable device"},
		{nicPlan{}, "rxe0", pcitopo.ClassUnknown, ""},
	} {
		core, logs := observer.New(zap.DebugLevel)
		tc.plan.report(zap.New(core), tc.nic, tc.class)
		warns := logs.FilterLevelExact(zap.WarnLevel).All()
		switch {
		case tc.warn == "" && len(warns) != 0:
			t.Errorf("%s (%s): warned %q", tc.nic, tc.class, warns[0].Message)
		case tc.warn != "" && (len(warns) != 1 || warns[0].Message != tc.warn):
			t.Errorf("%s (%s): warnings %v, want %q", tc.nic, tc.class, warns, tc.warn)
		}
	}
}

// TestLiveNICs reads this machine's sysfs (soft-RoCE in the VM): every
// device libibverbs lists is in pcitopo's list, and ranking it for a PCI
// device of the host keeps every device.
func TestLiveNICs(t *testing.T) {
	devs, err := ibverbs.Devices()
	if err != nil || len(devs) == 0 {
		t.Skipf("no RDMA device here: %v", err)
	}
	nics, err := pcitopo.NICs("/")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		if !slices.ContainsFunc(nics, func(n pcitopo.NIC) bool { return n.Name == d.Name }) {
			t.Errorf("%s is not in /sys/class/infiniband (%v)", d.Name, nics)
		}
	}
	for _, n := range nics {
		t.Logf("%s: %+v, %v", n.Name, n.Loc, n.Err)
	}
	ents, err := os.ReadDir("/sys/bus/pci/devices")
	if err != nil || len(ents) == 0 {
		t.Skipf("no PCI device to rank from: %v", err)
	}
	p := planNICs(ents[0].Name(), "/")
	if p.err != nil {
		t.Fatal(p.err)
	}
	got, class := p.order(devs)
	if len(got) != len(devs) {
		t.Fatalf("order lost devices: %v", names(got))
	}
	for _, d := range got {
		t.Logf("from %s: %s %s", ents[0].Name(), d.Name, class[d.Name])
	}
}
