{{/* The chart's name (nameOverride wins). */}}
{{- define "gpud.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Object names: the release's name when it contains the chart's, else release-chart. */}}
{{- define "gpud.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpud.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpud.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpud.labels" -}}
{{ include "gpud.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "gpud.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gpud.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The metrics port: the digits after the last colon of gpud.metricsAddr; "" when metrics are off. */}}
{{- define "gpud.metricsPort" -}}
{{- with include "gpud.effective" (list .Values.gpud.metricsAddr "metricsAddr" .) -}}
{{- $port := regexFind "[0-9]+$" . -}}
{{- if not $port -}}
{{- fail (printf "gpud.metricsAddr %q: want host:port or :port" .) -}}
{{- end -}}
{{- $port -}}
{{- end -}}
{{- end -}}

{{/* A path of gpud's as the node sees it: under hostPaths.run or hostPaths.state when the pod mounts it there. Call with (list PATH .Values). */}}
{{- define "gpud.hostPath" -}}
{{- $p := index . 0 -}}
{{- $v := index . 1 -}}
{{- if or (eq $p "/run/gpud") (hasPrefix "/run/gpud/" $p) -}}
{{- printf "%s%s" $v.hostPaths.run (trimPrefix "/run/gpud" $p) -}}
{{- else if or (eq $p "/var/lib/gpud") (hasPrefix "/var/lib/gpud/" $p) -}}
{{- printf "%s%s" $v.hostPaths.state (trimPrefix "/var/lib/gpud" $p) -}}
{{- else -}}
{{- $p -}}
{{- end -}}
{{- end -}}

{{/* Where the binary's own defaults put the paths and the port the pod must
     mount or open: used only when the matching value is null (unset), so
     that the chart passes no flag and still mounts what gpud uses. They
     are config.Defaults()'s; cmd/gpud TestChartDefaultsAreTheBinarys fails
     when they differ. */}}
{{- define "gpud.binaryDefaults" -}}
stateFile: /run/gpud/state.json
stateDir: /var/lib/gpud
controlSocket: /run/gpud/gpud.sock
checkpointRoot: /var/lib/gpud/checkpoints
bpfPinDir: /sys/fs/bpf/gpud
metricsAddr: ":9407"
kubeletDir: /var/lib/kubelet/device-plugins
podResourcesSocket: /var/lib/kubelet/pod-resources/kubelet.sock
cdiSpecDirs: [/etc/cdi, /var/run/cdi]
draCDIDir: /var/run/cdi
{{- end -}}

{{/* A setting's value as gpud will use it: the value when set, else the binary's default. Call with (list VALUE KEY $) */}}
{{- define "gpud.effective" -}}
{{- $v := index . 0 -}}
{{- if kindIs "invalid" $v -}}
{{- $v = index (include "gpud.binaryDefaults" (index . 2) | fromYaml) (index . 1) -}}
{{- end -}}
{{- if kindIs "slice" $v -}}{{ join "," $v }}{{- else -}}{{ $v }}{{- end -}}
{{- end -}}

{{/* The `gpud run` arguments of the settings that are set (not null), as
     YAML list items, one per line: a list is comma-joined, "" and [] are
     passed (they mean "off" or "none"). Call with a dict flag → value. */}}
{{- define "gpud.settingArgs" -}}
{{- range $flag, $v := . }}
{{- if not (kindIs "invalid" $v) }}
{{- if kindIs "slice" $v }}{{ $v = join "," $v }}{{ end }}
- {{ printf "--%s=%v" $flag $v | toJson }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The image: image.tag, else the chart's appVersion (the release's
     version, stamped by `make release`). Pulled IfNotPresent only for an
     immutable release tag (vMAJOR.MINOR.PATCH), Always otherwise: a moved
     tag (dev, latest) must not keep a node on an old gpud. */}}
{{- define "gpud.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "gpud.imagePullPolicy" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- .Values.image.pullPolicy | default (ternary "IfNotPresent" "Always" (regexMatch "^v[0-9]+\\.[0-9]+\\.[0-9]+$" $tag)) -}}
{{- end -}}
