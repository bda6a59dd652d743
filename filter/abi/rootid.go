package abi

// RootContextID returns the id of the plugin's root context (0 before the host created
// one). Tollgate runs one plugin per VM; with several, the lowest id is returned, so the
// answer does not depend on map order.
func RootContextID() uint32 {
	var best uint32
	for id := range roots {
		if best == 0 || id < best {
			best = id
		}
	}
	return best
}
