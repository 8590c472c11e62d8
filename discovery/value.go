package discovery

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/tensorferry/tensorferry/config"
	"github.com/tensorferry/tensorferry/memory"
)

// registration is the value a node keeps in etcd under its key: the public
// part of its NodeConfig. Leaving is set just before the node revokes its
// lease, so that the others tell a node that left from one whose lease
// expired.
type registration struct {
	Name        string `json:"name"`
	Address     string `json:"address"`
	DataAddress string `json:"data_address"`
	// GossipAddress is where the node gossips (gossip membership); empty
	// from a registration without it: the control port + 200.
	GossipAddress string   `json:"gossip_address,omitempty"`
	Devices       []string `json:"devices"`
	// MeshOnly marks a node that does not gossip (config's mesh_only):
	// gossiping nodes keep a mesh connection to it. Absent: false.
	MeshOnly bool `json:"mesh_only,omitempty"`
	Leaving  bool `json:"leaving,omitempty"`
}

// encodeNode returns the registration of n.
func encodeNode(n config.NodeConfig, leaving bool) ([]byte, error) {
	r := registration{Name: n.Name, Address: n.Address, DataAddress: n.DataAddress, GossipAddress: n.GossipAddress,
		MeshOnly: n.MeshOnly, Leaving: leaving}
	for _, d := range n.Devices {
		r.Devices = append(r.Devices, d.String())
	}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("discovery: encode %q: %w", n.Name, err)
	}
	if len(b) > maxValue {
		return nil, fmt.Errorf("discovery: the registration of %q is %d bytes, at most %d", n.Name, len(b), maxValue)
	}
	return b, nil
}

// decodeNode reads a registration, as hostile input: at most maxValue
// bytes, checked with config.CheckNode. Fields it does not know (from a
// later version) are ignored.
func decodeNode(b []byte) (config.NodeConfig, bool, error) {
	if len(b) > maxValue {
		return config.NodeConfig{}, false, fmt.Errorf("value of %d bytes, at most %d", len(b), maxValue)
	}
	var r registration
	d := json.NewDecoder(bytes.NewReader(b))
	if err := d.Decode(&r); err != nil {
		return config.NodeConfig{}, false, fmt.Errorf("value: %w", err)
	}
	if d.More() {
		return config.NodeConfig{}, false, fmt.Errorf("value: data after the object")
	}
	if len(r.Devices) > config.MaxNodeDevices {
		return config.NodeConfig{}, false, fmt.Errorf("devices: %d devices, at most %d", len(r.Devices), config.MaxNodeDevices)
	}
	n := config.NodeConfig{Name: r.Name, Address: r.Address, DataAddress: r.DataAddress, GossipAddress: r.GossipAddress, MeshOnly: r.MeshOnly}
	for i, s := range r.Devices {
		dev, err := memory.ParseDevice(s)
		if err != nil {
			return config.NodeConfig{}, false, fmt.Errorf("devices[%d]: %w", i, err)
		}
		n.Devices = append(n.Devices, dev)
	}
	if err := config.CheckNode(&n); err != nil {
		return config.NodeConfig{}, false, err
	}
	return n, r.Leaving, nil
}

// sameNode reports whether a and b announce the same addresses, devices
// and mesh_only mark.
func sameNode(a, b config.NodeConfig) bool {
	if a.Name != b.Name || a.Address != b.Address || a.DataAddress != b.DataAddress || a.GossipAddress != b.GossipAddress ||
		a.MeshOnly != b.MeshOnly || len(a.Devices) != len(b.Devices) {
		return false
	}
	for i := range a.Devices {
		if a.Devices[i] != b.Devices[i] {
			return false
		}
	}
	return true
}

// public returns the part of n that other nodes learn.
func public(n config.NodeConfig) config.NodeConfig {
	return config.NodeConfig{Name: n.Name, Address: n.Address, DataAddress: n.DataAddress, GossipAddress: n.GossipAddress,
		MeshOnly: n.MeshOnly, Devices: n.Devices}
}
