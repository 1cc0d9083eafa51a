// Package soak holds the minute-long soak tests of `make soak` (build tag soak): the exporter's components under
// sustained abuse, with their goroutines, pending work and memory measured before, during and after. They are not
// part of `make test`; the bounds they check have fast unit tests there.
package soak
