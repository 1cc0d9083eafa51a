package nvidiasmi

import "encoding/xml"

// xmlLog is the part of nvsmi_device_v9..v13.dtd that the Snapshot needs. Elements of several schema versions live
// side by side; the ones a file lacks stay empty.
type xmlLog struct {
	XMLName       xml.Name `xml:"nvidia_smi_log"`
	DriverVersion string   `xml:"driver_version"`
	CUDAVersion   string   `xml:"cuda_version"`
	AttachedGPUs  string   `xml:"attached_gpus"`
	GPUs          []xmlGPU `xml:"gpu"`
}

type xmlGPU struct {
	ID               string          `xml:"id,attr"`
	ProductName      string          `xml:"product_name"`
	UUID             string          `xml:"uuid"`
	PCI              xmlPCI          `xml:"pci"`
	MinorNumber      string          `xml:"minor_number"`
	CurrentMIG       string          `xml:"mig_mode>current_mig"`
	MIGDevices       []xmlMIGDevice  `xml:"mig_devices>mig_device"`
	FanSpeed         string          `xml:"fan_speed"`
	PerformanceState string          `xml:"performance_state"`
	FBMemory         xmlMemory       `xml:"fb_memory_usage"`
	Utilization      xmlUtilization  `xml:"utilization"`
	ECCAggregate     xmlECC          `xml:"ecc_errors>aggregate"`
	GPUTemp          string          `xml:"temperature>gpu_temp"`
	PowerReadings    xmlPower        `xml:"power_readings"`     // up to v12 on drivers before 530
	GPUPowerReadings xmlPower        `xml:"gpu_power_readings"` // v12 on 530+, v13
	TotalEnergy      string          `xml:"total_energy_consumption"`
	Clocks           xmlClocks       `xml:"clocks"`
	Processes        *xmlProcessList `xml:"processes"`

	MemoryTemp          string          `xml:"temperature>memory_temp"`
	RetiredPages        xmlRetiredPages `xml:"retired_pages"`
	RemappedRows        xmlRemappedRows `xml:"remapped_rows"`
	ClocksThrottle      xmlNamedValues  `xml:"clocks_throttle_reasons"`       // up to v12 on drivers before 535
	ClocksEvent         xmlNamedValues  `xml:"clocks_event_reasons"`          // v12 on 535+, v13
	ClocksEventCounters xmlNamedValues  `xml:"clocks_event_reasons_counters"` // v13 on 575+
	RecoveryAction      string          `xml:"gpu_recovery_action"`           // v13 on 565+
	Fabric              xmlFabric       `xml:"fabric"`                        // v12 on 550+, v13
	Virtualization      string          `xml:"gpu_virtualization_mode>virtualization_mode"`
	VGPULicenseStatus   string          `xml:"vgpu_software_licensed_product>license_status"`
}

type xmlPCI struct {
	BusID string `xml:"pci_bus_id"`
	// max_link_gen is the most the GPU and its slot can run (max_device_link_gen is the GPU's own, v12+).
	MaxLinkGen           string `xml:"pci_gpu_link_info>pcie_gen>max_link_gen"`
	CurrentLinkGen       string `xml:"pci_gpu_link_info>pcie_gen>current_link_gen"`
	DeviceCurrentLinkGen string `xml:"pci_gpu_link_info>pcie_gen>device_current_link_gen"`
	MaxLinkWidth         string `xml:"pci_gpu_link_info>link_widths>max_link_width"`
	CurrentLinkWidth     string `xml:"pci_gpu_link_info>link_widths>current_link_width"`
	ReplayCounter        string `xml:"replay_counter"`
}

type xmlRetiredPages struct {
	SingleBit         string `xml:"multiple_single_bit_retirement>retired_count"`
	DoubleBit         string `xml:"double_bit_retirement>retired_count"`
	PendingRetirement string `xml:"pending_retirement"`
	PendingBlacklist  string `xml:"pending_blacklist"` // the older name, v10-v12
}

type xmlRemappedRows struct {
	Correctable   string `xml:"remapped_row_corr"`
	Uncorrectable string `xml:"remapped_row_unc"`
	Pending       string `xml:"remapped_row_pending"`
	Failure       string `xml:"remapped_row_failure"`
}

type xmlFabric struct {
	State     string `xml:"state"`
	Status    string `xml:"status"`
	Bandwidth string `xml:"health>bandwidth"`
}

// xmlNamedValues is an element whose children are name-value pairs whose names the tables in health.go list (clock
// event reasons and their counters); the names differ between schema versions only by a prefix.
type xmlNamedValues struct {
	Values []xmlNamedValue `xml:",any"`
}

type xmlNamedValue struct {
	XMLName xml.Name
	Value   string `xml:",chardata"`
}

type xmlMIGDevice struct {
	UUID              string    `xml:"uuid"`
	GPUInstanceID     string    `xml:"gpu_instance_id"`
	ComputeInstanceID string    `xml:"compute_instance_id"`
	FBMemory          xmlMemory `xml:"fb_memory_usage"`
	// The text output names it "Shared FB Memory Usage"; accept that spelling too in case the XML follows.
	SharedFBMemory xmlMemory `xml:"shared_fb_memory_usage"`
}

type xmlMemory struct {
	Total    string `xml:"total"`
	Reserved string `xml:"reserved"` // v12 on 510+, v13
	Used     string `xml:"used"`
	Free     string `xml:"free"`
}

type xmlUtilization struct {
	GPU     string `xml:"gpu_util"`
	Memory  string `xml:"memory_util"`
	Encoder string `xml:"encoder_util"`
	Decoder string `xml:"decoder_util"`
}

type xmlECC struct {
	SingleBitTotal          string `xml:"single_bit>total"`
	DoubleBitTotal          string `xml:"double_bit>total"`
	SRAMCorrectable         string `xml:"sram_correctable"`
	SRAMUncorrectable       string `xml:"sram_uncorrectable"`
	SRAMUncorrectableParity string `xml:"sram_uncorrectable_parity"`
	SRAMUncorrectableSECDED string `xml:"sram_uncorrectable_secded"`
	DRAMCorrectable         string `xml:"dram_correctable"`
	DRAMUncorrectable       string `xml:"dram_uncorrectable"`
}

type xmlPower struct {
	PowerDraw          string `xml:"power_draw"`
	AveragePowerDraw   string `xml:"average_power_draw"`
	InstantPowerDraw   string `xml:"instant_power_draw"`
	CurrentPowerLimit  string `xml:"current_power_limit"`   // the limit enforced, v12 on 530+ and v13
	EnforcedPowerLimit string `xml:"enforced_power_limit"`  // the same, up to v12
	PowerLimit         string `xml:"power_limit"`           // the limit set by software (nvidia-smi -pl), up to v12
	RequestedLimit     string `xml:"requested_power_limit"` // the same, v12 on 530+ and v13
	TotalEnergy        string `xml:"total_energy_consumption"`
}

type xmlClocks struct {
	Graphics string `xml:"graphics_clock"`
	SM       string `xml:"sm_clock"`
	Memory   string `xml:"mem_clock"`
	Video    string `xml:"video_clock"`
}

type xmlProcessList struct {
	Text      string       `xml:",chardata"`
	Processes []xmlProcess `xml:"process_info"`
}

type xmlProcess struct {
	GPUInstanceID     string `xml:"gpu_instance_id"`
	ComputeInstanceID string `xml:"compute_instance_id"`
	PID               string `xml:"pid"`
	Type              string `xml:"type"`
	Name              string `xml:"process_name"`
	UsedMemory        string `xml:"used_memory"`
}
