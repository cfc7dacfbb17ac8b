{{/*
Labels Helm-managed objects carry besides their own (the DaemonSet's pod
selector and template labels stay app.kubernetes.io/name only: a selector
cannot change on upgrade).
*/}}
{{- define "vfnet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The ServiceAccount the driver runs as, as the API server names its user. */}}
{{- define "vfnet.driverUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:vfnet-driver
{{- end }}

{{- define "vfnet.driverImage" -}}
{{ .Values.image.driver.repository }}:{{ .Values.image.driver.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "vfnet.bindingImage" -}}
{{ .Values.image.binding.repository }}:{{ .Values.image.binding.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
The node configuration file: a string is the file as is; a map is written as
YAML with apiVersion and kind filled in when missing.
*/}}
{{- define "vfnet.nodeConfig" -}}
{{- if kindIs "string" .Values.nodeConfig -}}
{{ .Values.nodeConfig }}
{{- else -}}
{{ merge (deepCopy (.Values.nodeConfig | default dict)) (dict "apiVersion" "vfnet.io/v1alpha1" "kind" "NodeConfig") | toYaml }}
{{- end }}
{{- end }}
