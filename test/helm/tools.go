//go:build tools

package helm

import _ "helm.sh/helm/v4/cmd/helm"
