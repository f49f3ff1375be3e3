// Command argocd runs the Argo CD components the test bed starts (llm_testbed.argocd): the application
// controller and the repo server, plus the git credential helper the repo server calls itself as. The
// component is chosen, as in Argo CD's own binary, by ARGOCD_BINARY_NAME or else by the name it is called
// by. Argo CD's own cmd package also links the API server, Dex, notifications, the ApplicationSet controller,
// the commit server and the CLI, which the test bed never runs and which made up most of the build
// (docs/decisions.md, CI6).
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	controller "github.com/argoproj/argo-cd/v3/cmd/argocd-application-controller/commands"
	askpass "github.com/argoproj/argo-cd/v3/cmd/argocd-git-ask-pass/commands"
	reposerver "github.com/argoproj/argo-cd/v3/cmd/argocd-repo-server/commands"
	"github.com/argoproj/argo-cd/v3/common"
	logutil "github.com/argoproj/argo-cd/v3/util/log"
)

func main() {
	// klog (client-go's logger) writes through Argo CD's configured logger, as in the upstream binary.
	klog.SetLogger(logutil.NewLogrusLogger(logutil.NewWithCurrentConfig()))
	// Argo CD's binary turns gRPC's DNS SRV lookups off (util/grpc.DisableSRVLookups); the gRPC this module
	// builds with (the version its family shares, docs/decisions.md CI6) has them off already, and the
	// workaround panics when it finds them off. Nothing here may turn them on.

	name := filepath.Base(os.Args[0])
	if chosen := os.Getenv("ARGOCD_BINARY_NAME"); chosen != "" {
		name = chosen
	}
	components := map[string]func() *cobra.Command{
		common.CommandApplicationController: controller.NewCommand,
		common.CommandRepoServer:            reposerver.NewCommand,
		common.CommandGitAskPass:            askpass.NewCommand,
	}
	build, known := components[name]
	if !known {
		fmt.Fprintf(os.Stderr, "argocd (test bed build): no component %q; set ARGOCD_BINARY_NAME to %s, %s or %s\n",
			name, common.CommandApplicationController, common.CommandRepoServer, common.CommandGitAskPass)
		os.Exit(2)
	}
	if err := build().Execute(); err != nil {
		os.Exit(1)
	}
}
