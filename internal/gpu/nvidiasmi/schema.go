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
	PCIBusID         string          `xml:"pci>pci_bus_id"`
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
	Total string `xml:"total"`
	Used  string `xml:"used"`
	Free  string `xml:"free"`
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
	CurrentPowerLimit  string `xml:"current_power_limit"`
	EnforcedPowerLimit string `xml:"enforced_power_limit"`
	PowerLimit         string `xml:"power_limit"`
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
