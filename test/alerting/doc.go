// Package alerting runs deploy/alertmanager/alertmanager.yml in a real Alertmanager, fed by a real Prometheus that
// evaluates the alert rules (deploy/prometheus/rules.yml and deploy/alertmanager/rules-slurm.yml) on the real
// exporter's series, and checks that a webhook receiver of each owner gets their alerts with the labels that say
// whose they are.
//
//	go test -tags e2e -count=1 ./test/alerting
package alerting
