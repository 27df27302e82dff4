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
{{- with .Values.gpud.metricsAddr -}}
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
