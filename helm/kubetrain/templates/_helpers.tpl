{{/* Chart name. */}}
{{- define "kubetrain.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: <release>-<chart>, or the release name if it already contains the
chart name. Truncated to 63 characters (DNS label).
*/}}
{{- define "kubetrain.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* chart label value: name-version. */}}
{{- define "kubetrain.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "kubetrain.labels" -}}
helm.sh/chart: {{ include "kubetrain.chart" . }}
{{ include "kubetrain.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of the operator pods. */}}
{{- define "kubetrain.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kubetrain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The operator's ServiceAccount name. */}}
{{- define "kubetrain.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kubetrain.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create=false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Operator image reference. */}}
{{- define "kubetrain.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Runtime (PS/worker) image reference. */}}
{{- define "kubetrain.runtimeImage" -}}
{{- printf "%s:%s" .Values.runtimeImage.repository (default .Chart.AppVersion .Values.runtimeImage.tag) }}
{{- end }}

{{/* True if the cluster serves the prometheus-operator API. */}}
{{- define "kubetrain.hasMonitoringAPI" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end }}
{{- end }}
