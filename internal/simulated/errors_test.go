package simulated

import (
	"strings"
	"testing"
)

// Decoding errors speak of keys and kinds of value, never of the Go types behind them.
func TestDecodingErrorsNameKeysNotGoTypes(t *testing.T) {
	const gpu = "gpus:\n  - uuid: GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f60\n    memory_total_bytes: 1\n"
	cases := []struct{ file, want string }{
		{gpu + "    colour: green\n", `line 4: unknown key "colour" (valid keys here: clock_events_active, clocks_hertz, `},
		// The health keys sit on the GPU, and each of their sections lists its own keys.
		{gpu + "    colour: green\n", `pcie, performance_state, power_limit_watts, power_management_limit_watts,`},
		{gpu + "    pcie: {lanes: 4}\n", `line 4: unknown key "lanes" (valid keys here: generation, max_generation, max_width, replays, rx_bytes, rx_bytes_per_second, tx_bytes, tx_bytes_per_second, width)`},
		{gpu + "    nvlink: {links: [{link: 0, up: true}]}\n", `unknown key "up" (valid keys here: active, crc_data_errors, crc_flit_errors, link, recovery_errors, replay_errors)`},
		{gpu + "    remapped_rows: {pending: 1}\n", "line 4: want true or false, got the number 1"},
		{"gpus: 5\n", "line 1: want a list, got the number 5"},
		{gpu + "    processes:\n      - pid: 1\n        used_memory_bytes: 5\n        identity: {pod: [1]}\n",
			"line 7: want a text value, got a list"},
		// An identity takes the identity labels the outputs write, by their names.
		{gpu + "    processes:\n      - pid: 1\n        used_memory_bytes: 5\n        identity: {podd: p}\n",
			`line 7: unknown key "podd" (valid keys here: container, container_id, namespace, pod, pod_labels, pod_uid, qos, runtime, slurm_job_id, systemd_unit, user)`},
		{"driver: 1\n", `unknown key "driver" (valid keys here: allocatable, allocations, cuda_version, driver_version, gpus)`},
	}
	for _, c := range cases {
		_, err := parse([]byte(c.file))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parse(%q) = %v, want it to contain %q", c.file, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "simulated.") {
			t.Errorf("parse(%q) error names a Go type: %v", c.file, err)
		}
	}
}
