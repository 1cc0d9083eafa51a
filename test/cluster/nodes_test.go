//go:build e2e

package cluster

// The three simulated nodes. PIDs are above the kernel's largest pid_max (4,194,304), so that no process of this
// host lends them its name, and identities are preset.

// gpuA has a GPU in MIG mode, its two instances allocated and in use, and a Slurm job on its second GPU. One
// process is a containerd container's, which the node's own ps names and Prometheus does not carry.
const gpuA = `
driver_version: "580.95.05"
cuda_version: "13.0"
gpus:
  - uuid: GPU-aaaaaaaa-0000-4000-8000-000000000000
    name: NVIDIA A100-SXM4-80GB
    mig_mode: enabled
    memory_total_bytes: 85899345920
    memory_used_bytes: 12884901888
    temperature_celsius: 40
    power_usage_watts: 250
    mig_instances:
      - {uuid: MIG-aaaaaaaa-0001-4000-8000-000000000000, gpu_instance: 1, compute_instance: 0, profile: 3g.40gb, memory_total_bytes: 42949672960, memory_used_bytes: 8589934592}
      - {uuid: MIG-aaaaaaaa-0002-4000-8000-000000000000, gpu_instance: 2, compute_instance: 0, profile: 3g.40gb, memory_total_bytes: 42949672960, memory_used_bytes: 4294967296}
    processes:
      - pid: 9000101
        name: python3
        type: compute
        used_memory_bytes: 8589934592
        sm_utilization_ratio: 0.35
        gpu_instance: 1
        compute_instance: 0
        identity: {namespace: vision, pod: resnet-train-0, container: train, pod_uid: 0a0a0a0a-0000-4000-8000-000000000001, container_id: 1111111111111111111111111111111111111111111111111111111111111111, runtime: containerd}
      - pid: 9000102
        name: tritonserver
        type: compute
        used_memory_bytes: 4294967296
        gpu_instance: 2
        compute_instance: 0
        identity: {namespace: vision, pod: resnet-serve-0, container: serve, pod_uid: 0a0a0a0a-0000-4000-8000-000000000002}
  - uuid: GPU-aaaaaaaa-1111-4000-8000-000000000000
    name: NVIDIA A100-SXM4-80GB
    memory_total_bytes: 85899345920
    utilization_ratio: 0.93
    temperature_celsius: 66
    power_usage_watts: 390
    processes:
      - pid: 9000201
        name: lmp
        type: compute
        used_memory_bytes: 64424509440
        sm_utilization_ratio: 0.91
        identity: {slurm_job_id: "88231"}
allocations:
  - {namespace: vision, pod: resnet-train-0, container: train, resource: nvidia.com/mig-3g.40gb, device_ids: ["MIG-aaaaaaaa-0001-4000-8000-000000000000"]}
  - {namespace: vision, pod: resnet-serve-0, container: serve, resource: nvidia.com/mig-3g.40gb, device_ids: ["MIG-aaaaaaaa-0002-4000-8000-000000000000"]}
`

// gpuB's GPU is shared by a pod that requested it and one that did not: an unrequested use. It needs a reset
// after an XID 48.
const gpuB = `
driver_version: "580.95.05"
cuda_version: "13.0"
gpus:
  - uuid: GPU-bbbbbbbb-0000-4000-8000-000000000000
    name: NVIDIA H100 80GB HBM3
    memory_total_bytes: 85520809984
    utilization_ratio: 0.71
    temperature_celsius: 52
    power_usage_watts: 402
    recovery_action: gpu_reset
    xid_errors: {48: 1, 13: 2}
    processes:
      - pid: 9000301
        name: python3
        type: compute
        used_memory_bytes: 23622320128
        sm_utilization_ratio: 0.41
        identity: {namespace: ml-training, pod: bert-finetune-0, container: trainer, pod_uid: 0b0b0b0b-0000-4000-8000-000000000001}
      - pid: 9000302
        name: python
        type: compute
        used_memory_bytes: 4294967296
        sm_utilization_ratio: 0.03
        identity: {namespace: data-science, pod: jupyter-bob-0, container: notebook, pod_uid: 0b0b0b0b-0000-4000-8000-000000000002}
allocations:
  - {namespace: ml-training, pod: bert-finetune-0, container: trainer, device_ids: ["GPU-bbbbbbbb-0000-4000-8000-000000000000"]}
`

// gpuC's allocations come from a kubelet: GPU 0 is held and used, GPU 1 held by a pod that runs nothing on it,
// on a PCIe link of half its width.
const gpuC = `
driver_version: "580.95.05"
cuda_version: "13.0"
gpus:
  - uuid: GPU-cccccccc-0000-4000-8000-000000000000
    name: NVIDIA L40S
    memory_total_bytes: 48305799168
    utilization_ratio: 0.55
    temperature_celsius: 48
    power_usage_watts: 210
    processes:
      - pid: 9000401
        name: vllm
        type: compute
        used_memory_bytes: 40802189312
        sm_utilization_ratio: 0.52
        identity: {namespace: inference, pod: vllm-0, container: server, pod_uid: 0c0c0c0c-0000-4000-8000-000000000001}
      - pid: 9000402
        name: ollama
        type: compute
        used_memory_bytes: 2147483648
        identity: {systemd_unit: ollama.service}
  - uuid: GPU-cccccccc-1111-4000-8000-000000000000
    name: NVIDIA L40S
    memory_total_bytes: 48305799168
    utilization_ratio: 0
    temperature_celsius: 31
    power_usage_watts: 35
    pcie: {generation: 4, max_generation: 4, width: 8, max_width: 16}
`
