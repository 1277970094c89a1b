// Command render writes one of Istio's benchmark inputs (a text/template file of
// pilot/pkg/xds/testdata/benchmarks, with sprig's functions, as Istio's benchmark executes it)
// for a given number of services, so our bench-generation reads the same documents.
//
//	render TEMPLATE SERVICES [INSTANCES] > out.yaml
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"text/template"

	"github.com/Masterminds/sprig/v3"
)

// input carries the fields Istio's templates read (the benchmark's ConfigInput).
type input struct {
	Name      string
	Services  int
	Instances int
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: render TEMPLATE SERVICES [INSTANCES]")
		os.Exit(2)
	}
	file := os.Args[1]
	services, err := strconv.Atoi(os.Args[2])
	check(err)
	instances := 0
	if len(os.Args) > 3 {
		instances, err = strconv.Atoi(os.Args[3])
		check(err)
	}
	base := filepath.Base(file)
	name := base[:len(base)-len(filepath.Ext(base))]
	tmpl, err := template.New("").Funcs(sprig.TxtFuncMap()).ParseFiles(file)
	check(err)
	check(tmpl.ExecuteTemplate(os.Stdout, base, input{Name: name, Services: services, Instances: instances}))
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
}
